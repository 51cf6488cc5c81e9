/**
 * Abortable sleeping and the retry backoff of `allocate`: exponential with full jitter, capped.
 *
 * @module
 */

/** Sleeps `ms`, or rejects with `signal.reason` as soon as it aborts. Leaves no timer behind. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Backoff parameters, all in ms. */
export interface Backoff {
  readonly initialMs: number;
  readonly maxMs: number;
  readonly factor: number;
}

/**
 * The wait before retry number `attempt` (0-based): a uniform draw from
 * `[0, min(maxMs, initialMs × factor^attempt)]`. Full jitter spreads nodes that failed together.
 */
export function backoffDelay(backoff: Backoff, attempt: number, random = Math.random): number {
  const ceiling = Math.min(backoff.maxMs, backoff.initialMs * backoff.factor ** attempt);
  return Math.round(random() * ceiling);
}
