/**
 * Reproduces Deno KV's partial commit: an atomic operation whose `sum` meets a value that is not a
 * `Deno.KvU64` throws, yet keeps every mutation that came before the `sum`. See
 * `deno-kv-partial-commit.md` next to this file.
 *
 * Run it: `deno run -A docs/deno-kv-partial-commit.ts` (prints what it observed, on a temp file).
 *
 * @example
 * ```ts ignore
 * import { reproduce } from "./deno-kv-partial-commit.ts";
 * using kv = await Deno.openKv(":memory:");
 * console.log(await reproduce(kv));
 * ```
 *
 * @module
 */

/** What one run observed. */
export interface Observed {
  /** The error message of the commit whose `sum` failed. */
  readonly error: string | undefined;
  /** Whether the `set` placed **before** the failing `sum` was applied anyway. */
  readonly setBeforeSumApplied: boolean;
  /** Whether a `set` placed **after** the failing `sum` was applied. */
  readonly setAfterSumApplied: boolean;
  /** Whether a `sum` on a good counter, placed before the failing one, was applied. */
  readonly goodSumBeforeApplied: boolean;
  /** Whether a failing check (placed after a `sum`) still stops the whole commit. */
  readonly failedCheckAppliesNothing: boolean;
}

/** Runs the reproduction on `kv` under the key prefix `prefix` (it writes only there). */
export async function reproduce(kv: Deno.Kv, prefix: Deno.KvKey = ["repro"]): Promise<Observed> {
  const k = (...parts: Deno.KvKeyPart[]): Deno.KvKey => [...prefix, ...parts];
  const failing = async (op: Deno.AtomicOperation): Promise<string | undefined> => {
    try {
      await op.commit();
      return undefined;
    } catch (err) {
      return err instanceof Error ? err.message : String(err);
    }
  };
  // A counter with garbage in it: anyone with write access to the store can do this.
  await kv.set(k("gen"), "x");

  // 1. check + set, then the sum: the commit throws, the set stays.
  const error = await failing(
    kv.atomic()
      .check({ key: k("a"), versionstamp: null })
      .set(k("a"), 1)
      .sum(k("gen"), 1n),
  );
  const setBeforeSumApplied = (await kv.get(k("a"))).value === 1;

  // 2. the sum first, then a set: nothing after the failing mutation is applied.
  await failing(kv.atomic().sum(k("gen"), 1n).set(k("b"), 1));
  const setAfterSumApplied = (await kv.get(k("b"))).value !== null;

  // 3. a good sum, then the failing one: the good one stays.
  await kv.set(k("good"), new Deno.KvU64(5n));
  await failing(kv.atomic().sum(k("good"), 1n).sum(k("gen"), 1n));
  const good = (await kv.get(k("good"))).value;
  const goodSumBeforeApplied = good instanceof Deno.KvU64 && good.value === 6n;

  // 4. checks are all evaluated before any mutation: a failing one applies nothing.
  await kv.set(k("counter"), new Deno.KvU64(0n));
  const res = await kv.atomic()
    .sum(k("counter"), 1n)
    .check({ key: k("a"), versionstamp: null }) // "a" exists: fails
    .commit();
  const counter = (await kv.get(k("counter"))).value;
  const failedCheckAppliesNothing = !res.ok && counter instanceof Deno.KvU64 &&
    counter.value === 0n;

  return {
    error,
    setBeforeSumApplied,
    setAfterSumApplied,
    goodSumBeforeApplied,
    failedCheckAppliesNothing,
  };
}

if (import.meta.main) {
  const dir = await Deno.makeTempDir({ prefix: "kv-partial-commit-" });
  try {
    using kv = await Deno.openKv(`${dir}/repro.kv`);
    console.log(`Deno ${Deno.version.deno}, local file:`);
    console.table(await reproduce(kv));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
