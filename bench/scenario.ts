/**
 * One measurement in a cold process (spawned by `bench/compare.ts`): opens the store a JSON spec
 * names, runs one scenario and prints one JSON line `{ ops, seconds, rate, p50, p99, firstRate }`
 * (latencies in ms; `firstRate` is the rate of the first 1,000 operations, warm-up included).
 *
 * Scenarios: `raw` (one create-if-absent commit per key on the same client: the ceiling of a
 * protocol that commits each key on its own), `new` (new-key allocations), `join` (a second node
 * acquires keys a first one created), `release` (final releases of held keys), `race` (allocate
 * the shared key set as one of several racing processes; prints the IDs too).
 *
 * deno run -A bench/scenario.ts '<spec json>'
 *
 * @module
 */
import { Allocator } from "../mod.ts";
import { DenoKvBackend } from "../src/backends/kv/mod.ts";
import { EtcdBackend } from "../src/backends/etcd/mod.ts";
import type { Backend } from "../src/allocator/backend.ts";
import { b, rawClient } from "../tests/_support/etcd_fixture.ts";

/** What `compare.ts` asks a child to measure. */
export interface ScenarioSpec {
  readonly store: "kv" | "etcd";
  /** KV: the file; etcd: the endpoints. */
  readonly where: string | readonly string[];
  readonly scenario: "raw" | "new" | "join" | "release" | "race";
  /** Operations (keys). */
  readonly count: number;
  /** Calls in flight. */
  readonly width: number;
  /** Backend options for the measured node (e.g. `groupCommit`, `honorCiliumLocks`). */
  readonly options?: Record<string, unknown>;
  /** `race`: wait until this wall-clock time (ms) before starting, so racers start together. */
  readonly startAt?: number;
  /** `race`: this racer's node name. */
  readonly node?: string;
}

/** What a child prints. */
export interface ScenarioResult {
  readonly ops: number;
  readonly seconds: number;
  readonly rate: number;
  readonly p50: number;
  readonly p99: number;
  readonly firstRate: number;
  /** `race`: key → ID as this racer saw them. */
  readonly ids?: Record<string, number>;
}

const PREFIX = "bench";
const KEY = (i: number) => `k8s:bench=${i};`;

/** Runs `op(i)` for i in [0, count) with `width` in flight; per-op latencies and timings. */
async function measure(
  count: number,
  width: number,
  op: (i: number) => Promise<unknown>,
): Promise<ScenarioResult> {
  const latencies = new Float64Array(count);
  let next = 0;
  let firstDone = 0;
  const start = performance.now();
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < count) {
      const i = next++;
      const t = performance.now();
      await op(i);
      latencies[i] = performance.now() - t;
      if (i === Math.min(count, 1_000) - 1) firstDone = performance.now();
    }
  }));
  const seconds = (performance.now() - start) / 1000;
  const sorted = [...latencies].sort((x, y) => x - y);
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
  const first = Math.min(count, 1_000);
  return {
    ops: count,
    seconds,
    rate: count / seconds,
    p50: at(0.5),
    p99: at(0.99),
    firstRate: first / (((firstDone || performance.now()) - start) / 1000),
  };
}

async function openBackend(spec: ScenarioSpec, node: string): Promise<Backend & AsyncDisposable> {
  if (spec.store === "etcd") {
    return await EtcdBackend.connect({
      endpoints: [...spec.where as string[]],
      prefix: PREFIX,
      node,
      ...spec.options,
    });
  }
  const kv = await Deno.openKv(spec.where as string);
  const backend = new DenoKvBackend(kv, { prefix: [PREFIX], node, ...spec.options });
  return Object.assign(backend, {
    [Symbol.asyncDispose]: () => Promise.resolve(kv.close()),
  });
}

const ALLOCATOR = { min: 1, max: 1_000_000, leaseTtlMs: 60_000, maxAttempts: 64 };

async function run(spec: ScenarioSpec): Promise<ScenarioResult> {
  const { count, width } = spec;
  if (spec.scenario === "raw") return await raw(spec);
  if (spec.scenario === "race") {
    await using backend = await openBackend(spec, spec.node ?? "racer");
    await using alloc = await Allocator.open(backend, ALLOCATOR);
    await alloc.waitForInitialSync();
    await new Promise((r) => setTimeout(r, Math.max(0, (spec.startAt ?? 0) - Date.now())));
    const ids: Record<string, number> = {};
    const result = await measure(count, width, async (i) => {
      ids[KEY(i)] = (await alloc.allocate(KEY(i))).id;
    });
    return { ...result, ids };
  }
  await using backend = await openBackend(spec, "node-a");
  await using alloc = await Allocator.open(backend, ALLOCATOR);
  await alloc.waitForInitialSync();
  if (spec.scenario === "new") return await measure(count, width, (i) => alloc.allocate(KEY(i)));
  if (spec.scenario === "release") {
    for (let i = 0; i < count; i += 64) {
      await Promise.all(
        Array.from({ length: Math.min(64, count - i) }, (_, j) => alloc.allocate(KEY(i + j))),
      );
    }
    return await measure(count, width, (i) => alloc.release(KEY(i)));
  }
  // join: node A creates the keys (untimed); node B, whose cache learns them, joins each.
  for (let i = 0; i < count; i += 64) {
    await Promise.all(
      Array.from({ length: Math.min(64, count - i) }, (_, j) => alloc.allocate(KEY(i + j))),
    );
  }
  await using other = await openBackend(spec, "node-b");
  await using joiner = await Allocator.open(other, ALLOCATOR);
  await joiner.waitForInitialSync();
  while (joiner.cachedId(KEY(count - 1)) === undefined) await new Promise((r) => setTimeout(r, 5));
  return await measure(count, width, (i) => joiner.allocate(KEY(i)));
}

/** The ceiling: one create-if-absent commit per key on the same client, shaped like a new key. */
async function raw(spec: ScenarioSpec): Promise<ScenarioResult> {
  const { count, width } = spec;
  if (spec.store === "etcd") {
    const client = rawClient(spec.where as string[]);
    try {
      return await measure(count, width, async (i) => {
        const key = b(`${PREFIX}/raw/${i}`);
        await client.kv.txn({
          compare: [{ key, target: "Version", result: "Equal", version: 0 }],
          success: [{ request_put: { key, value: b(KEY(i)) } }],
        });
      });
    } finally {
      client.close();
    }
  }
  using kv = await Deno.openKv(spec.where as string);
  return await measure(count, width, async (i) => {
    const res = await kv.atomic()
      .check({ key: ["raw", "key", KEY(i)], versionstamp: null })
      .check({ key: ["raw", "id", i], versionstamp: null })
      .sum(["raw", "gen"], 1n)
      .set(["raw", "id", i], { key: KEY(i) })
      .set(["raw", "key", KEY(i)], { id: i })
      .set(["raw", "ref", KEY(i), "n"], { id: i, lease: "l" })
      .set(["raw", "log", Date.now(), "n", String(i)], { id: i, key: KEY(i) }, {
        expireIn: 600_000,
      })
      .commit();
    if (!res.ok) throw new Error("raw commit failed");
  });
}

if (import.meta.main) {
  const spec = JSON.parse(Deno.args[0]) as ScenarioSpec;
  console.log(JSON.stringify(await run(spec)));
}
