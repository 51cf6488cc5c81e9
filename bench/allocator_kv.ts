/**
 * Allocator throughput on one Deno KV file: the raw atomic commit rate (the ceiling), new-key
 * allocations, existing-key acquisitions, and cached re-allocations.
 *
 * @module
 */
import { Allocator, DenoKvBackend } from "../mod.ts";

/** One row of a benchmark table. */
export interface BenchRow {
  /** What was measured. */
  readonly name: string;
  /** The figure, with its unit. */
  readonly value: string;
}

const rate = (n: number, ms: number) => (n / ms) * 1000;
const fmt = (n: number) => Math.round(n).toLocaleString("en-US");

/** Runs the Deno KV allocator benchmarks in a temp dir; returns table rows. */
export async function benchAllocatorKv(count = 2_000): Promise<BenchRow[]> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-bench-" });
  try {
    using kv = await Deno.openKv(`${dir}/bench.kv`);

    // The ceiling: a create-if-absent commit of the same shape as a new-key allocation
    // (two absence checks, two counters, four sets).
    let t = performance.now();
    for (let i = 0; i < count; i++) {
      const res = await kv.atomic()
        .check({ key: ["raw", "key", `k${i}`], versionstamp: null })
        .check({ key: ["raw", "id", i], versionstamp: null })
        .set(["raw", "id", i], { key: `k${i}` })
        .set(["raw", "key", `k${i}`], { id: i })
        .sum(["raw", "touch", `k${i}`], 1n)
        .set(["raw", "ref", `k${i}`, "n"], { id: i, lease: "l" })
        .set(["raw", "log", Date.now(), "n", i], { id: i, key: `k${i}` }, { expireIn: 600_000 })
        .sum(["raw", "gen"], 1n)
        .commit();
      if (!res.ok) throw new Error("raw commit failed");
    }
    const raw = rate(count, performance.now() - t);

    const backend = new DenoKvBackend(kv, { prefix: ["bench"], node: "a" });
    await using a = await Allocator.open(backend, { max: 1_000_000 });
    await a.waitForInitialSync();
    t = performance.now();
    for (let i = 0; i < count; i++) await a.allocate(`key-${i}`);
    const newKeys = rate(count, performance.now() - t);

    const other = new DenoKvBackend(kv, { prefix: ["bench"], node: "b" });
    await using b = await Allocator.open(other, { max: 1_000_000 });
    await b.waitForInitialSync();
    // Let b's cache learn a's masters, so b acquires with a hint (no read).
    await new Promise((r) => setTimeout(r, 1_500));
    t = performance.now();
    for (let i = 0; i < count; i++) await b.allocate(`key-${i}`);
    const existing = rate(count, performance.now() - t);

    const cachedCount = 2_000_000;
    t = performance.now();
    for (let i = 0; i < cachedCount; i++) await a.allocate("key-1");
    const cached = rate(cachedCount, performance.now() - t);

    return [
      { name: "KV raw atomic commits/s (ceiling)", value: fmt(raw) },
      {
        name: "KV new-key allocations/s",
        value: `${fmt(newKeys)} (${(newKeys / raw).toFixed(2)}× raw)`,
      },
      {
        name: "KV existing-key acquisitions/s (other node)",
        value: `${fmt(existing)} (${(existing / raw).toFixed(2)}× raw)`,
      },
      { name: "cached re-allocations/s", value: fmt(cached) },
    ];
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) console.table(await benchAllocatorKv());
