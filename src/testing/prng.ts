/**
 * Seeded randomness for property tests and the nemesis suite: a run is replayed by giving the
 * same seed.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * const [a, b] = [prng(42), prng(42)];
 * assert.equal(a(), b()); // one seed, one sequence: a failing run can be replayed
 * const pick = picker(prng(7));
 * assert.ok(["a", "b", "c"].includes(pick(["a", "b", "c"])));
 * ```
 * @module
 */

/** mulberry32: a small, fast seeded PRNG returning floats in [0, 1). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = Math.imul(a ^ (a >>> 15), a | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A function picking one element of a non-empty list uniformly with `random`. */
export function picker(random: () => number): <T>(items: readonly T[]) => T {
  return <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)];
}

/** A uniform integer in `[min, max]`. */
export function between(random: () => number, min: number, max: number): number {
  return min + Math.floor(random() * (max - min + 1));
}

/**
 * A Zipf sampler over ranks `0 … n-1` (rank 0 the most frequent) with exponent `s`: rank `r` is
 * drawn with probability proportional to `1 / (r + 1)^s`.
 */
export function zipf(random: () => number, n: number, s = 1): () => number {
  const cumulative = new Float64Array(n);
  let total = 0;
  for (let r = 0; r < n; r++) {
    total += 1 / Math.pow(r + 1, s);
    cumulative[r] = total;
  }
  return () => {
    const x = random() * total;
    let lo = 0;
    let hi = n - 1;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (cumulative[mid] < x) lo = mid + 1;
      else hi = mid;
    }
    return lo;
  };
}

/** Shuffles `items` in place (Fisher–Yates) with `random` and returns it. */
export function shuffle<T>(random: () => number, items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}
