/**
 * The Deno KV backend against the store's own ceiling: raw atomic commits of the same shape as a
 * new-key acquire (2 checks, 4 sets, 2 sums), then `session.acquire` of new keys, both sequential
 * on one KV file. The ratio shows the backend's overhead per new key (target ≥ 0.7).
 *
 * @example
 * ```ts ignore
 * const { rawCommitsPerSec, newKeyAcquiresPerSec } = await benchKvBackend("/tmp/bench.kv");
 * ```
 * @module
 */
import { DenoKvBackend } from "../src/backends/kv/mod.ts";

const OPS = 2_000;

/** Measures raw commits/s and new-key acquires/s on the KV file at `path`. */
export async function benchKvBackend(
  path: string,
  ops: number = OPS,
): Promise<{ rawCommitsPerSec: number; newKeyAcquiresPerSec: number }> {
  using kv = await Deno.openKv(path);
  const run = `${Date.now()}-${crypto.randomUUID().slice(0, 8)}`;

  const raw = ["bench-raw", run];
  const rawStart = performance.now();
  for (let i = 0; i < ops; i++) {
    const key = `key-${i}`;
    const res = await kv.atomic()
      .check({ key: [...raw, "key", key], versionstamp: null })
      .check({ key: [...raw, "id", i + 1], versionstamp: null })
      .set([...raw, "id", i + 1], { key })
      .set([...raw, "key", key], { id: i + 1 })
      .sum([...raw, "touch", key], 1n)
      .set([...raw, "ref", key, "bench"], { id: i + 1, lease: run })
      .set([...raw, "log", Date.now(), "bench", crypto.randomUUID()], { id: i + 1, key }, {
        expireIn: 600_000,
      })
      .sum([...raw, "gen"], 1n)
      .commit();
    if (!res.ok) throw new Error("raw commit failed");
  }
  const rawCommitsPerSec = ops / ((performance.now() - rawStart) / 1000);

  const backend = new DenoKvBackend(kv, { prefix: ["bench-acquire", run], node: "bench" });
  await using session = await backend.openSession({
    leaseTtlMs: 60_000,
    readOnly: false,
    onLeaseReplaced: () => {},
  });
  const signal = new AbortController().signal;
  const start = performance.now();
  for (let i = 0; i < ops; i++) {
    const res = await session.acquire({
      key: `key-${i}`,
      signal,
      pickCandidate: () => i + 1,
    });
    if (!res.created) throw new Error("expected a new master");
  }
  const newKeyAcquiresPerSec = ops / ((performance.now() - start) / 1000);
  return { rawCommitsPerSec, newKeyAcquiresPerSec };
}

if (import.meta.main) {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-bench-" });
  try {
    const r = await benchKvBackend(`${dir}/bench.kv`);
    console.log(
      `raw commits/s ${r.rawCommitsPerSec.toFixed(0)}, new-key acquires/s ` +
        `${r.newKeyAcquiresPerSec.toFixed(0)}, ratio ` +
        `${(r.newKeyAcquiresPerSec / r.rawCommitsPerSec).toFixed(2)}`,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}
