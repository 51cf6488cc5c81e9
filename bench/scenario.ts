/**
 * One measurement in a process of its own (spawned by `bench/compare.ts`): opens the store a JSON
 * spec names, runs an untimed warm-up of the same operation on other keys (`warm`, default 300:
 * JIT, connections, leases), then the timed scenario, and prints one JSON line
 * `{ ops, seconds, rate, p50, p99, firstRate }` (latencies in ms; `firstRate` is the rate of the
 * first 1,000 timed operations).
 *
 * Scenarios: `raw` (one create-if-absent commit per key on the same client: the ceiling of a
 * protocol that commits each key on its own), `new` (new-key allocations), `join` (a second node
 * acquires keys a first one created), `release` (final releases of held keys; with the option
 * `releaseInBackground` the time runs until `flush()` has landed every deletion), `realloc`
 * (cached re-allocations of held keys), `race` (allocate the shared key set as one of several
 * racing processes, in a shuffled order when `order` is set; prints the IDs too).
 *
 * deno run -A bench/scenario.ts '<spec json>'
 *
 * @module
 */
import { Allocator } from "../mod.ts";
import type { Backend } from "../src/allocator/backend.ts";
import { loadHarness } from "../src/testing/harness.ts";
import type { BenchCell, BenchHooks } from "../src/testing/bench.ts";
import { rate } from "./_table.ts";
import { between, prng } from "../src/testing/prng.ts";

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
  /** Untimed operations of the same kind on other keys before the timed ones (default 300). */
  readonly warm?: number;
  /** Seed of a shuffled key order (`race`); in key order when absent. */
  readonly order?: number;
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
  /** `release`: releases per second until every deletion had landed (`flush()` included). */
  readonly landed?: number;
}

const PREFIX = "bench";
const KEY = (i: number) => `k8s:bench=${i};`;
const WARM_KEY = (i: number, node = "") => `k8s:warm${node}=${i};`;
const WARM = 300;
/** Keys per round of the `realloc` scenario. */
const REALLOC_KEYS = 1_000;

/** `0 … count-1` in an order shuffled by `seed` (the same seed, the same order). */
function shuffled(count: number, seed: number): number[] {
  const order = Array.from({ length: count }, (_, i) => i);
  const random = prng(seed);
  for (let i = count - 1; i > 0; i--) {
    const j = between(random, 0, i);
    [order[i], order[j]] = [order[j], order[i]];
  }
  return order;
}

/** Runs `op(i)` for i in [0, count) with `width` in flight, untimed (warm-up, fill). */
async function untimed(
  count: number,
  width: number,
  op: (i: number) => Promise<unknown>,
): Promise<void> {
  await rate(count, width, op);
}

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
  const { releaseInBackground: _, ...backendOptions } = spec.options ?? {};
  return await (await hooks(spec)).open(spec.where, PREFIX, node, backendOptions);
}

async function hooks(spec: ScenarioSpec): Promise<BenchHooks> {
  return (await loadHarness(spec.store)).bench;
}

const ALLOCATOR = { min: 1, max: 1_000_000, leaseTtlMs: 60_000, maxAttempts: 64 };

async function run(spec: ScenarioSpec): Promise<ScenarioResult> {
  const { count, width } = spec;
  const warm = spec.warm ?? WARM;
  if (spec.scenario === "raw") return await raw(spec, warm);
  if (spec.scenario === "race") {
    const node = spec.node ?? "racer";
    await using backend = await openBackend(spec, node);
    await using alloc = await Allocator.open(backend, ALLOCATOR);
    await alloc.waitForInitialSync();
    await untimed(warm, Math.min(width, 16), (i) => alloc.allocate(WARM_KEY(i, node)));
    await new Promise((r) => setTimeout(r, Math.max(0, (spec.startAt ?? 0) - Date.now())));
    const order = spec.order === undefined ? undefined : shuffled(count, spec.order);
    const ids: Record<string, number> = {};
    const result = await measure(count, width, async (i) => {
      const key = KEY(order ? order[i] : i);
      ids[key] = (await alloc.allocate(key)).id;
    });
    return { ...result, ids };
  }
  await using backend = await openBackend(spec, "node-a");
  await using alloc = await Allocator.open(backend, { ...ALLOCATOR, ...allocatorOptions(spec) });
  await alloc.waitForInitialSync();
  const fill = (n: number, key: (i: number) => string) =>
    untimed(n, 64, (i) => alloc.allocate(key(i)));
  if (spec.scenario === "new") {
    await untimed(warm, width, (i) => alloc.allocate(WARM_KEY(i)));
    return await measure(count, width, (i) => alloc.allocate(KEY(i)));
  }
  if (spec.scenario === "realloc") {
    await fill(REALLOC_KEYS, KEY);
    await untimed(warm * 100, width, (i) => alloc.allocate(KEY(i % REALLOC_KEYS)));
    return await measure(count, width, (i) => alloc.allocate(KEY(i % REALLOC_KEYS)));
  }
  if (spec.scenario === "release") {
    await fill(warm, WARM_KEY);
    await fill(count, KEY);
    await untimed(warm, width, (i) => alloc.release(WARM_KEY(i)));
    await alloc.flush();
    // The caller's wait, and with write-behind releases the time until every deletion landed.
    const t = performance.now();
    const result = await measure(count, width, (i) => alloc.release(KEY(i)));
    await alloc.flush();
    const seconds = (performance.now() - t) / 1000;
    return { ...result, landed: count / seconds };
  }
  // join: node A creates the keys (untimed); node B, whose cache learns them, joins each.
  await fill(warm, WARM_KEY);
  await fill(count, KEY);
  await using other = await openBackend(spec, "node-b");
  await using joiner = await Allocator.open(other, ALLOCATOR);
  await joiner.waitForInitialSync();
  while (joiner.cachedId(KEY(count - 1)) === undefined) await new Promise((r) => setTimeout(r, 5));
  await untimed(warm, width, (i) => joiner.allocate(WARM_KEY(i)));
  return await measure(count, width, (i) => joiner.allocate(KEY(i)));
}

/** Allocator options among a cell's options (the rest are the backend's). */
function allocatorOptions(spec: ScenarioSpec): Record<string, unknown> {
  return spec.options?.releaseInBackground ? { releaseInBackground: true } : {};
}

/** The ceiling: one create-if-absent commit per key on the same client, shaped like a new key. */
async function raw(spec: ScenarioSpec, warm: number): Promise<ScenarioResult> {
  await using writer = await (await hooks(spec)).raw(spec.where);
  await untimed(warm, spec.width, (i) => writer.write(spec.count + i, WARM_KEY(i)));
  return await measure(spec.count, spec.width, (i) => writer.write(i, KEY(i)));
}

if (import.meta.main) {
  const spec = JSON.parse(Deno.args[0]) as ScenarioSpec;
  console.log(JSON.stringify(await run(spec)));
}
