/**
 * One fresh node of the scale benchmark (spawned by `bench/scale.ts`): opens the store a JSON spec
 * names and prints one JSON line per phase.
 *
 * - `sync`: the time from opening (connect included) until the initial list is in the cache;
 * - `gc`: the same, then one GC pass over the range (`{ ms, deleted }`);
 * - `catchup`: after the initial sync it prints `{ synced: true }`, then waits until the cache
 *   holds `expect` identities and prints the wall-clock time it got there (`{ at }`);
 * - `churn`: after the initial sync, `cycles` allocate/release cycles over 1,000 label sets of its
 *   own (16 in flight), sampling its RSS and heap every tenth of the way, each after a full
 *   collection when run with `--v8-flags=--expose-gc` (`{ rssMiB: [...], heapMiB: [...] }`).
 *
 * Peak RSS is measured from outside (`/usr/bin/time -v`), for the whole process.
 *
 * deno run -A bench/scale_node.ts '<spec json>'
 *
 * @module
 */
import { Allocator } from "../mod.ts";
import { IdentityAllocator, Labels } from "../src/identity/mod.ts";
import { loadHarness } from "../src/testing/harness.ts";

/** What `scale.ts` asks a node to do. */
export interface ScaleNodeSpec {
  readonly kind: string;
  readonly where: unknown;
  readonly prefix: string;
  readonly node: string;
  /** The identity layer, or the plain allocator with string keys. */
  readonly layer: "identity" | "plain";
  readonly task: "sync" | "gc" | "catchup" | "churn";
  /** `catchup`: the number of identities to wait for; `churn`: the cycles to run. */
  readonly expect?: number;
}

const spec = JSON.parse(Deno.args[0]) as ScaleNodeSpec;
const { bench } = await loadHarness(spec.kind);
const print = (line: Record<string, unknown>) => console.log(JSON.stringify(line));
const started = performance.now();
await using backend = await bench.open(spec.where, spec.prefix, spec.node);
const range = { min: 256, max: 65535 };
if (spec.layer === "identity") {
  await using identities = await IdentityAllocator.open(backend, { clusterId: 0 });
  await identities.waitForInitialSync();
  print({ ms: performance.now() - started });
  if (spec.task === "catchup") {
    // Counted from the change stream (its replay, then live batches): global IDs only.
    const global = new Set<number>();
    const stop = new AbortController();
    const stream = identities.changes({ signal: stop.signal });
    print({ synced: true });
    for await (const { added, deleted } of stream) {
      for (const id of added.keys()) if (id >= range.min && id <= range.max) global.add(id);
      for (const id of deleted) global.delete(id);
      if (global.size >= spec.expect!) break;
    }
    print({ at: Date.now(), cached: global.size });
    stop.abort();
  }
  if (spec.task === "churn") {
    const cycles = spec.expect!;
    // A full collection before each sample (the parent runs this task with `--expose-gc`): what
    // is retained, not how far V8 lets its heap grow before collecting.
    const gc = (globalThis as { gc?: () => void }).gc;
    const heap: number[] = [];
    const rss = () => {
      gc?.();
      const m = Deno.memoryUsage();
      heap.push(Math.round(m.heapUsed / 1024 / 1024));
      return m.rss / 1024 / 1024;
    };
    const samples = [rss()];
    let next = 0;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (next < cycles) {
        const i = next++;
        const labels = Labels.parse([`k8s:app=churn-${i % 1_000}`]);
        const { identity } = await identities.allocate(labels);
        await identities.release(identity);
        if ((i + 1) % Math.max(1, Math.floor(cycles / 10)) === 0) samples.push(rss());
      }
    }));
    print({ rssMiB: samples.map((x) => Math.round(x)), heapMiB: heap });
  }
} else {
  // One pass marks what is unused: no grace, so that a store's own (Kubernetes: Cilium's heartbeat
  // timeout, which keeps the freshly seeded identities) does not turn the pass into a read.
  await using alloc = await Allocator.open(backend, {
    ...range,
    readOnly: spec.task !== "gc",
    ...(spec.task === "gc" ? { gcGraceMs: 0 } : {}),
  });
  await alloc.waitForInitialSync();
  print({ ms: performance.now() - started, cached: alloc.status().cachedIds });
  if (spec.task === "gc") {
    const t = performance.now();
    const stats = await alloc.runGc();
    print({ gcMs: performance.now() - t, deleted: stats.deletedIds.length });
  }
}
