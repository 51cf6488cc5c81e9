/**
 * Allocator throughput on one Deno KV file: the raw atomic commit rate of a commit shaped like a
 * new-key allocation (the ceiling), the backend session alone, new-key allocations through the
 * allocator, existing-key acquisitions by a second node, and cached re-allocations.
 *
 * @module
 */
import { Allocator, DenoKvBackend } from "../mod.ts";
import { type BenchRow, fmt, rate } from "./_table.ts";

/** Runs the Deno KV allocator benchmarks in a temp dir; returns table rows. */
export async function benchAllocatorKv(count = 2_000): Promise<BenchRow[]> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-bench-" });
  try {
    using kv = await Deno.openKv(`${dir}/bench.kv`);

    // Two absence checks, the change counter first, four sets: what a new-key allocation commits.
    const rawCommit = async (run: string, i: number) => {
      const res = await kv.atomic()
        .check({ key: [run, "key", `k${i}`], versionstamp: null })
        .check({ key: [run, "id", i], versionstamp: null })
        .sum([run, "gen"], 1n)
        .set([run, "log", Date.now(), "n", i], { id: i, key: `k${i}` }, { expireIn: 600_000 })
        .set([run, "id", i], { key: `k${i}` })
        .set([run, "key", `k${i}`], { id: i })
        .set([run, "ref", `k${i}`, "n"], { id: i, lease: "l" })
        .commit();
      if (!res.ok) throw new Error("raw commit failed");
    };
    await rate(count, 1, (i) => rawCommit("warm-up", i)); // the file's first writes are slow
    const raw = await rate(count, 1, (i) => rawCommit("raw", i));

    const sessionBackend = new DenoKvBackend(kv, { prefix: ["bench-session"], node: "s" });
    await using session = await sessionBackend.openSession({
      leaseTtlMs: 60_000,
      readOnly: false,
      onLeaseReplaced: () => {},
    });
    const signal = new AbortController().signal;
    const sessionRate = await rate(
      count,
      1,
      (i) => session.acquire({ key: `key-${i}`, signal, pickCandidate: () => i + 1 }),
    );

    const backend = new DenoKvBackend(kv, { prefix: ["bench"], node: "a" });
    await using a = await Allocator.open(backend, { max: 1_000_000 });
    await a.waitForInitialSync();
    const newKeys = await rate(count, 1, (i) => a.allocate(`key-${i}`));

    const other = new DenoKvBackend(kv, { prefix: ["bench"], node: "b" });
    await using b = await Allocator.open(other, { max: 1_000_000 });
    await b.waitForInitialSync();
    // Let b's cache learn a's masters, so that b acquires with a hint and no read.
    while (b.status().cachedIds < count) await new Promise((r) => setTimeout(r, 50));
    const existing = await rate(count, 1, (i) => b.allocate(`key-${i}`));

    const cached = await rate(2_000_000, 1, () => a.allocate("key-1"));

    const ratio = (n: number) => `${fmt(n)} (${(n / raw).toFixed(2)}× raw)`;
    return [
      { name: "KV raw atomic commits/s (ceiling)", value: fmt(raw) },
      { name: "KV session.acquire new keys/s", value: ratio(sessionRate) },
      { name: "KV new-key allocations/s", value: ratio(newKeys) },
      { name: "KV existing-key acquisitions/s (2nd node)", value: ratio(existing) },
      { name: "cached re-allocations/s", value: fmt(cached) },
    ];
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

if (import.meta.main) console.table(await benchAllocatorKv());
