/**
 * The retry backoff of `allocate`: exponential with full jitter, capped.
 *
 * @module
 */

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
