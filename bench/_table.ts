/**
 * What every benchmark module shares: its table row, a rate measurement and number formatting.
 *
 * @module
 */

/** One row of a benchmark table. */
export interface BenchRow {
  /** What was measured. */
  readonly name: string;
  /** The figure, with its unit. */
  readonly value: string;
}

/** Runs `fn(i)` for i in [0, count) with `width` calls in flight; returns operations per second. */
export async function rate(
  count: number,
  width: number,
  fn: (i: number) => Promise<unknown>,
): Promise<number> {
  let next = 0;
  const start = performance.now();
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < count) await fn(next++);
  }));
  return count / ((performance.now() - start) / 1000);
}

/** `n` rounded and grouped, e.g. `12,345`. */
export function fmt(n: number): string {
  return Math.round(n).toLocaleString("en-US");
}

/** The median of `xs` (the mean of the middle two for an even count). */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/** Rates as `median/s [min–max]`, e.g. `1,234/s [1,100–1,300]`. */
export function rateSpread(xs: readonly number[]): string {
  return `${fmt(median(xs))}/s [${fmt(Math.min(...xs))}–${fmt(Math.max(...xs))}]`;
}

/** Durations in seconds as `median ms [min–max]`, e.g. `1097 ms [1084–1218]`. */
export function msSpread(seconds: readonly number[]): string {
  const ms = (x: number) => (x * 1000).toFixed(0);
  return `${ms(median(seconds))} ms [${ms(Math.min(...seconds))}–${ms(Math.max(...seconds))}]`;
}
