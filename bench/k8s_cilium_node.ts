/**
 * One idalloc node of the `k8s-cilium` bench, in a process of its own as Cilium's node is
 * (`k8s_cilium.ts` runs it): opens the Kubernetes backend through a kubeconfig and prints JSON
 * lines shaped like Cilium's node's: `{sync_ms}` (connect, session, initial list), then, with a
 * label file, after `warm` untimed allocations and releases, `{alloc_ms, allocated, is_new}` for
 * allocating the file's label sets `width` at a time. With `hold` it keeps them until stdin ends.
 *
 * deno run -A bench/k8s_cilium_node.ts '{"kubeconfig": …, "context": …, "node": …, "labels"?: …,
 *   "width"?: 16, "warm"?: 100, "hold"?: false}'
 *
 * @module
 */
import { readFile } from "node:fs/promises";
import process from "node:process";
import { Allocator } from "../mod.ts";
import { K8sBackend } from "../src/backends/k8s/mod.ts";
import { Labels } from "../src/identity/mod.ts";

/** What `k8s_cilium.ts` tells the node. */
export interface BenchNodeConfig {
  readonly kubeconfig: string;
  readonly context: string;
  readonly node: string;
  /** A JSON file of label sets (`[["k8s:a=1", …], …]`), as Cilium's node reads them. */
  readonly labels?: string;
  readonly width?: number;
  readonly warm?: number;
  readonly hold?: boolean;
}

const say = (o: unknown) => console.log(JSON.stringify(o));

async function main(config: BenchNodeConfig): Promise<void> {
  const t0 = performance.now();
  await using backend = await K8sBackend.connect({
    node: config.node,
    kubeconfig: config.kubeconfig,
    context: config.context,
  });
  await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
  await alloc.waitForInitialSync();
  say({ sync_ms: performance.now() - t0 });
  if (config.labels === undefined) return;
  const sets = JSON.parse(await readFile(config.labels, "utf8")) as string[][];
  const keys = sets.map((s) => Labels.parse(s).toKvstoreString());
  const width = config.width ?? 1;
  const warm = Array.from(
    { length: config.warm ?? 0 },
    (_, i) => `k8s:warmup=${config.node}-${i};`,
  );
  await inFlight(warm, width, async (key) => {
    await alloc.allocate(key);
    await alloc.release(key);
  });
  let isNew = 0;
  const t1 = performance.now();
  await inFlight(keys, width, async (key) => {
    if ((await alloc.allocate(key)).isNew) isNew++;
  });
  say({ alloc_ms: performance.now() - t1, allocated: keys.length, is_new: isNew });
  if (config.hold) { for await (const _ of process.stdin) { /* held until stdin ends */ } }
}

/** Runs `fn` on every item, `width` at a time. */
async function inFlight<T>(items: readonly T[], width: number, fn: (t: T) => Promise<void>) {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) await fn(items[next++]);
  }));
}

if (import.meta.main) {
  await main(JSON.parse(process.argv[2]) as BenchNodeConfig);
  // stdin's reader would keep the process alive.
  process.exit(0);
}
