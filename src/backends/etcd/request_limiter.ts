/**
 * A token bucket for etcd requests (Cilium's `etcd.qps`): `qps` tokens per second, burst `qps`.
 * Callers reserve a token and wait for it; an aborted wait gives its token back.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { RequestLimiter } from "./request_limiter.ts";
 * const limiter = new RequestLimiter(20);
 * await limiter.take();
 * assert.deepEqual(limiter.stats(), { qps: 20, taken: 1, delayed: 0, waitedMs: 0 });
 * ```
 *
 * @module
 */
import { sleep } from "../../abort.ts";

/** Time source of the limiter; tests inject a virtual clock. */
export interface LimiterClock {
  /** Milliseconds, monotonic. */
  now(): number;
  /** Resolves after `ms`, or rejects with `signal.reason` when it aborts. */
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** Counters of a limiter. */
export interface LimiterStats {
  /** The configured rate, or `undefined` when unlimited. */
  readonly qps?: number;
  /** Tokens handed out. */
  readonly taken: number;
  /** Requests that had to wait for their token. */
  readonly delayed: number;
  /** Sum of the waits, in ms. */
  readonly waitedMs: number;
}

/** The real clock. */
export const realClock: LimiterClock = {
  now: () => performance.now(),
  sleep,
};

/** Token bucket; with `qps` undefined every `take` returns at once (and is still counted). */
export class RequestLimiter {
  readonly #qps?: number;
  readonly #clock: LimiterClock;
  #tokens: number;
  #last: number;
  #taken = 0;
  #delayed = 0;
  #waitedMs = 0;

  /** @param qps tokens per second (and burst); @param clock time source */
  constructor(qps: number | undefined, clock: LimiterClock = realClock) {
    this.#qps = qps;
    this.#clock = clock;
    this.#tokens = Math.max(1, qps ?? 1);
    this.#last = clock.now();
  }

  /** Takes one token, waiting for it if the bucket is empty. */
  async take(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    this.#taken++;
    if (this.#qps === undefined) return;
    const burst = Math.max(1, this.#qps);
    const now = this.#clock.now();
    this.#tokens = Math.min(burst, this.#tokens + ((now - this.#last) * this.#qps) / 1000);
    this.#last = now;
    // Reserve now (the balance may go negative): later callers queue behind this one.
    this.#tokens -= 1;
    if (this.#tokens >= 0) return;
    const waitMs = (-this.#tokens * 1000) / this.#qps;
    this.#delayed++;
    this.#waitedMs += waitMs;
    try {
      await this.#clock.sleep(waitMs, signal);
    } catch (err) {
      this.#tokens += 1;
      throw err;
    }
  }

  /** The counters. */
  stats(): LimiterStats {
    return { qps: this.#qps, taken: this.#taken, delayed: this.#delayed, waitedMs: this.#waitedMs };
  }
}
