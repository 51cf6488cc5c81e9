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
import type { Backend } from "../src/allocator/backend.ts";
import { loadHarness } from "../src/backends/testing.ts";
import type { BenchCell, BenchHooks } from "./backend.ts";

/** What `compare.ts` asks a child to measure. */
export interface ScenarioSpec {
  /** The backend's kind: its harness opens the store. */
  readonly store: string;
  /** How to reach the store, as the backend's `BenchHooks.fresh` gave it (a file, endpoints). */
  readonly where: unknown;
  readonly scenario: BenchCell["scenario"];
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
  return await (await hooks(spec)).open(spec.where, PREFIX, node, spec.options);
}

async function hooks(spec: ScenarioSpec): Promise<BenchHooks> {
  return (await loadHarness(spec.store)).bench;
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
  await using writer = await (await hooks(spec)).raw(spec.where);
  return await measure(spec.count, spec.width, (i) => writer.write(i, KEY(i)));
}

if (import.meta.main) {
  const spec = JSON.parse(Deno.args[0]) as ScenarioSpec;
  console.log(JSON.stringify(await run(spec)));
}
