/**
 * The renewal schedule of a lease judged on wall clocks (Deno KV's lease record, Kubernetes' node
 * Lease), shared by their lease keepers:
 * - one lease write at a time: timed renewals, renewals on demand and replacements queue up
 *   ({@linkcode RenewalSchedule.serial});
 * - a timer every third of the TTL, counted from the end of the previous renewal;
 * - a lease is **stale** within the clock-skew margin of its end on its holder's clock
 *   ({@linkcode leaseStale}): others, whose clocks may run ahead by the margin, may judge it
 *   lapsed, so it is never renewed then but replaced (a new lease id or epoch);
 * - the holder's claim is valid until its end less the margin, kept on `Date.now()`'s scale
 *   ({@linkcode claimUntil}) although the backend's clock is injectable (tests).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { leaseStale, RenewalSchedule } from "./renewal.ts";
 *
 * assert.equal(leaseStale(9_000, 10_000, 1_000), true);
 * assert.equal(leaseStale(8_999, 10_000, 1_000), false);
 * let renewals = 0;
 * const schedule = new RenewalSchedule(3_000, async () => void renewals++);
 * await schedule.serial(async () => renewals++);
 * schedule.start();
 * await schedule.stop();
 * assert.equal(renewals, 1);
 * ```
 *
 * @module
 */

/** Whether a lease ending at `expiresAt` is too close to its end to be renewed at `now`. */
export function leaseStale(now: number, expiresAt: number, maxClockSkewMs: number): boolean {
  return now >= expiresAt - maxClockSkewMs;
}

/**
 * Until when, on `Date.now()`'s scale, a lease ending at `expiresAt` (on the backend's clock,
 * which reads `now`) certainly counts as live for every observer.
 */
export function claimUntil(expiresAt: number, maxClockSkewMs: number, now: number): number {
  return Date.now() + (expiresAt - maxClockSkewMs - now);
}

/** The renewal queue and timer of one lease keeper (see the module doc). */
export class RenewalSchedule {
  readonly #periodMs: number;
  readonly #renew: () => Promise<void>;
  readonly #afterTick: () => void;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #chain: Promise<unknown> = Promise.resolve();
  #closed = false;

  /**
   * @param ttlMs the lease's lifetime: the timer fires every third of it
   * @param renew one timed renewal (it handles its own failures)
   * @param afterTick called after each timed renewal, whatever its outcome, while open
   */
  constructor(ttlMs: number, renew: () => Promise<void>, afterTick: () => void = () => {}) {
    this.#periodMs = Math.max(1, Math.floor(ttlMs / 3));
    this.#renew = renew;
    this.#afterTick = afterTick;
  }

  /** Whether {@linkcode RenewalSchedule.stop} was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Runs `fn` after every lease write queued before it; its failure does not stop the queue. */
  serial<T>(fn: () => Promise<T> | T): Promise<T> {
    const run = this.#chain.then(fn);
    this.#chain = run.catch(() => {});
    return run;
  }

  /** Starts the timer (again after each renewal, until stopped). */
  start(): void {
    if (this.#closed) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      void this.serial(this.#renew).finally(() => {
        if (this.#closed) return;
        this.#afterTick();
        this.start();
      });
    }, this.#periodMs);
  }

  /** Stops the timer and waits for the queued writes. */
  async stop(): Promise<void> {
    this.#closed = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    await this.#chain;
  }
}
