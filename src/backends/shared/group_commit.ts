/**
 * The queueing half of group commit, shared by the backends: calls that arrive while a batch is in
 * flight wait and go out together in the next one. The first call goes out at once, alone, so an
 * idle node pays no latency. A batch holds members in arrival order within the store's limits
 * (each member weighs something against each limit; the first member always fits) and never two
 * members that write the same key. A call whose signal aborts while queued leaves the queue; once
 * sent, its write may still land (the caller cleans up, as after any aborted write).
 *
 * How a batch is sent, and how its members learn their own outcome, is the backend's
 * (`src/backends/etcd/batch.ts`, `src/backends/kv/batch.ts`).
 *
 * @example A backend's batcher
 * ```ts
 * import assert from "node:assert/strict";
 * import { GroupCommit, settle } from "./group_commit.ts";
 *
 * const group = new GroupCommit<string, string>({
 *   enabled: true,
 *   limits: [64],
 *   measure: (key) => ({ writes: new Set([key]), weights: [1] }),
 *   send: async (batch) => {
 *     for (const m of batch) settle(m, () => m.resolve(`wrote ${m.payload}`));
 *   },
 * });
 * assert.equal(await group.submit("a", AbortSignal.timeout(1000)), "wrote a");
 * ```
 *
 * @module
 */
import { captureContext, withContext } from "../../telemetry/instruments.ts";

/** One call's part of a batch. */
export interface Member<P, R> {
  /** What the call asks the store to do. */
  readonly payload: P;
  /** The call's signal (a backend sending a member on its own passes it on). */
  readonly signal: AbortSignal;
  /** Settled already (answered, failed, or aborted): never settle twice, see {@linkcode settle}. */
  settled: boolean;
  /** Answers the call. */
  resolve(result: R): void;
  /** Fails the call. */
  reject(err: unknown): void;
}

/** How a backend's batches are built and sent. */
export interface GroupCommitOptions<P, R> {
  /** `false`: every call is sent at once, on its own (no queue). */
  readonly enabled: boolean;
  /** The store's limits per batch, in the order of {@linkcode GroupCommitOptions.measure}'s weights. */
  readonly limits: readonly number[];
  /** What every batch weighs before its members (e.g. a mutation all of them share). */
  readonly base?: readonly number[];
  /** The keys a payload writes and its weight against each limit. */
  measure(
    payload: P,
  ): { readonly writes: ReadonlySet<string>; readonly weights: readonly number[] };
  /** Sends `batch` (one member: on its own) and settles every member. */
  send(batch: Member<P, R>[]): Promise<void>;
}

interface Queued<P, R> extends Member<P, R> {
  readonly writes: ReadonlySet<string>;
  readonly weights: readonly number[];
  /** The caller's telemetry context: a batch is traced under its first member's span. */
  readonly context: ReturnType<typeof captureContext>;
}

/** Queues concurrent calls of one session into batches (see the module doc). */
export class GroupCommit<P, R> {
  readonly #options: GroupCommitOptions<P, R>;
  readonly #queue: Queued<P, R>[] = [];
  #inFlight = false;

  /** @param options the backend's limits and sender */
  constructor(options: GroupCommitOptions<P, R>) {
    this.#options = options;
  }

  /**
   * Sends `payload` alone when nothing is in flight, else with the next batch; resolves with its
   * own outcome. Rejects with `signal.reason` when it aborts first.
   */
  submit(payload: P, signal: AbortSignal): Promise<R> {
    signal.throwIfAborted();
    const { promise, resolve, reject } = Promise.withResolvers<R>();
    const member: Queued<P, R> = {
      payload,
      signal,
      ...this.#options.measure(payload),
      context: captureContext(),
      resolve,
      reject,
      settled: false,
    };
    const onAbort = () => settle(member, () => reject(signal.reason));
    signal.addEventListener("abort", onAbort, { once: true });
    promise.finally(() => signal.removeEventListener("abort", onAbort)).catch(() => {});
    if (!this.#options.enabled) {
      void this.#options.send([member]);
      return promise;
    }
    this.#queue.push(member);
    if (!this.#inFlight) this.#drain();
    return promise;
  }

  /** Sends batches until the queue is empty; one batch in flight at a time. */
  #drain(): void {
    this.#inFlight = true;
    void (async () => {
      try {
        for (let batch = this.#take(); batch.length > 0; batch = this.#take()) {
          await withContext(batch[0].context, () => this.#options.send(batch));
        }
      } finally {
        this.#inFlight = false;
        // A call queued while the last batch was being answered must not wait.
        if (this.#queue.some((m) => !m.settled)) this.#drain();
      }
    })();
  }

  /** The next batch: live members in arrival order, within the limits, no shared key. */
  #take(): Queued<P, R>[] {
    const { limits, base } = this.#options;
    const batch: Queued<P, R>[] = [];
    const keys = new Set<string>();
    const sums = limits.map((_, i) => base?.[i] ?? 0);
    for (let i = 0; i < this.#queue.length;) {
      const m = this.#queue[i];
      if (m.settled) {
        this.#queue.splice(i, 1);
        continue;
      }
      const fits = batch.length === 0 ||
        (m.weights.every((w, j) => sums[j] + w <= limits[j]) &&
          ![...m.writes].some((k) => keys.has(k)));
      if (!fits) {
        // Full in some limit: nothing later fits either.
        if (sums.some((s, j) => s >= limits[j])) break;
        i++;
        continue;
      }
      this.#queue.splice(i, 1);
      batch.push(m);
      for (const k of m.writes) keys.add(k);
      m.weights.forEach((w, j) => (sums[j] += w));
    }
    return batch;
  }
}

/** Runs `fn` once for `member`: an abort and an answer may race. */
export function settle<P, R>(member: Member<P, R>, fn: () => void): void {
  if (member.settled) return;
  member.settled = true;
  fn();
}
