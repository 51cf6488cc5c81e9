/**
 * Identity-layer benchmark: 10,000 distinct label sets get global identities on node A, then node
 * B makes 100,000 allocations drawn from them with Zipf-like reuse (a few hot sets, a long tail),
 * and node C's watch-fed cache is measured for memory per cached identity.
 *
 * Memory figures are `Deno.memoryUsage().heapUsed` deltas between two full garbage collections
 * (V8's `gc()`, reached through `node:v8`/`node:vm` so no flag is needed), with node A idle.
 *
 * @example
 * ```ts ignore
 * import { benchIdentity } from "./identity.ts";
 * console.table(await benchIdentity()); // a temporary Deno KV file
 * ```
 *
 * @module
 */
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { DenoKvBackend } from "../mod.ts";
import { type BenchRow, fmt } from "./_table.ts";
import type { Backend } from "../src/allocator/backend.ts";
import { IdentityAllocator, Labels } from "../src/identity/mod.ts";
import type { BackendFactory } from "../src/testing/fixture.ts";
import { prng, zipf } from "../src/testing/prng.ts";

/** Sizes of the workload. */
export interface IdentityBenchOptions {
  /** Distinct label sets. @default {10000} */
  readonly distinct?: number;
  /** Zipf-distributed allocations drawn from them. @default {100000} */
  readonly draws?: number;
  /** Zipf exponent (1 = classic Zipf). @default {1} */
  readonly exponent?: number;
}

const perSec = (n: number, ms: number) => `${fmt((n / ms) * 1000)}/s`;

/** Pod-like label sets: app, namespace, service account, cluster, and a version label. */
function labelStrings(i: number): string[] {
  return [
    `k8s:app=app-${i}`,
    `k8s:io.kubernetes.pod.namespace=ns-${i % 97}`,
    `k8s:io.cilium.k8s.policy.serviceaccount=sa-${i % 13}`,
    "k8s:io.cilium.k8s.policy.cluster=default",
    `k8s:version=v${i % 5}`,
  ];
}

/** V8's full GC, exposed at run time (the same as `--v8-flags=--expose-gc`). */
function exposeGc(): (() => void) | undefined {
  try {
    setFlagsFromString("--expose-gc");
    const gc = runInNewContext("gc");
    return typeof gc === "function" ? gc : undefined;
  } catch {
    return undefined;
  }
}

interface Target {
  backend(node: string): Promise<Backend>;
  close(): Promise<void>;
  readonly what: string;
}

function kvTarget(path: string): Target {
  const handles: Deno.Kv[] = [];
  const prefix = ["bench-identity", crypto.randomUUID()];
  return {
    what: `Deno KV file`,
    async backend(node) {
      const kv = await Deno.openKv(path);
      handles.push(kv);
      return new DenoKvBackend(kv, { prefix, node, pollIntervalMs: 50 });
    },
    close() {
      for (const kv of handles) kv.close();
      return Promise.resolve();
    },
  };
}

async function factoryTarget(factory: BackendFactory): Promise<Target> {
  const fx = await factory.create();
  return {
    what: factory.kind,
    backend: (node) => fx.backend(node),
    close: async () => await fx[Symbol.asyncDispose](),
  };
}

/**
 * Runs the identity benchmark on `target`: a conformance {@linkcode BackendFactory} (a fresh
 * fixture), the path of a Deno KV file, or (by default) a temporary Deno KV file.
 */
export async function benchIdentity(
  target?: BackendFactory | string,
  options: IdentityBenchOptions = {},
): Promise<BenchRow[]> {
  const distinct = options.distinct ?? 10_000;
  const draws = options.draws ?? 100_000;
  const exponent = options.exponent ?? 1;
  let tempDir: string | undefined;
  let store: Target;
  if (target === undefined) {
    tempDir = await Deno.makeTempDir({ prefix: "idalloc-bench-identity-" });
    store = kvTarget(`${tempDir}/identities.kv`);
  } else if (typeof target === "string") {
    store = kvTarget(target);
  } else {
    store = await factoryTarget(target);
  }
  const rows: BenchRow[] = [];
  const label = (name: string) => `identity (${store.what}): ${name}`;
  try {
    let t = performance.now();
    const sets = Array.from({ length: distinct }, (_, i) => Labels.parse(labelStrings(i)));
    rows.push({ name: label("label sets parsed"), value: perSec(distinct, performance.now() - t) });

    // Node A creates every identity (each is a new master in the store).
    await using a = await IdentityAllocator.open(await store.backend("node-a"));
    await a.waitForInitialSync();
    t = performance.now();
    for (const labels of sets) await a.allocate(labels);
    rows.push({
      name: label(`new global identities, ${fmt(distinct)} distinct`),
      value: perSec(distinct, performance.now() - t),
    });

    // Node C only watches: what does its cache cost per identity (entry, key string, decoded
    // labels)? Measured while node A is idle, between full collections.
    const gc = exposeGc();
    gc?.();
    const before = Deno.memoryUsage().heapUsed;
    {
      await using c = await IdentityAllocator.open(await store.backend("node-c"));
      await c.waitForInitialSync();
      const reserved = [...c.reserved].length;
      const cached = [...c.entries()].length - reserved;
      gc?.();
      const after = Deno.memoryUsage().heapUsed;
      rows.push({
        name: label(
          `heap per cached identity (${fmt(cached)} in a watch-fed cache` +
            `${gc ? "" : "; no gc(): includes uncollected garbage"})`,
        ),
        value: `${fmt((after - before) / Math.max(1, cached))} B`,
      });
    }

    // Node B: Zipf-drawn allocations; a set's first draw references the existing identity in
    // the store, later draws are local reference counts.
    await using b = await IdentityAllocator.open(await store.backend("node-b"));
    await b.waitForInitialSync();
    const picks = Uint32Array.from({ length: draws }, zipf(prng(42), distinct, exponent));
    const touched = new Set<number>();
    for (const i of picks) touched.add(i);
    t = performance.now();
    for (const i of picks) await b.allocate(sets[i]);
    rows.push({
      name: label(
        `allocations, ${fmt(draws)} Zipf(s=${exponent}) draws over ${fmt(distinct)} sets ` +
          `(${fmt(touched.size)} first uses)`,
      ),
      value: perSec(draws, performance.now() - t),
    });

    t = performance.now();
    let found = 0;
    for (const i of picks) if (b.lookup(sets[i])) found++;
    rows.push({
      name: label(`cached lookups by labels (${fmt(found)} hits)`),
      value: perSec(draws, performance.now() - t),
    });
    return rows;
  } finally {
    await store.close();
    if (tempDir) await Deno.remove(tempDir, { recursive: true });
  }
}

if (import.meta.main) console.table(await benchIdentity(Deno.args[0]));
