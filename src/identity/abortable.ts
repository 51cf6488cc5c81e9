/**
 * Iterating an async source until a signal aborts, without depending on the source to notice.
 *
 * @module
 */

/**
 * Yields from `source` until it ends or `signal` aborts. On abort it returns at once even if the
 * source is stuck in a pending `next()`, and asks the source to finish without waiting for it: a
 * source that misses its own abort must never hang whoever closes us.
 */
export async function* untilAborted<T>(
  source: AsyncIterable<T>,
  signal: AbortSignal,
): AsyncGenerator<T> {
  const iterator = source[Symbol.asyncIterator]();
  const aborted = Promise.withResolvers<undefined>();
  const onAbort = () => aborted.resolve(undefined);
  signal.addEventListener("abort", onAbort, { once: true });
  if (signal.aborted) onAbort();
  try {
    while (true) {
      const next = iterator.next();
      // A rejection that arrives after the abort has nobody left to hear it.
      next.catch(() => {});
      const result = await Promise.race([next, aborted.promise]);
      if (result === undefined || result.done) return;
      yield result.value;
    }
  } finally {
    signal.removeEventListener("abort", onAbort);
    iterator.return?.()?.catch(() => {});
  }
}
