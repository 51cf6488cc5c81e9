/**
 * One idalloc node in its own process, beside Cilium's CRD-mode nodes
 * (`cilium_interop.test.ts`): connects through a kubeconfig, prints `{"ready":true}` once its
 * cache is synced, then takes commands on stdin, one per line:
 * - `go <unix ms>`: from that time on (racing nodes start together), allocates the label sets of
 *   the file `labels` (`[["k8s:a=1", …], …]`, as Cilium's node reads them), `concurrency` at a
 *   time, prints `{ids, created, errors, t0, t1}` and holds them;
 * - `answers`: prints `{answers: {key: get(key)}, reassigned}`;
 * - `end`: closes the node (releasing its lease) and exits.
 *
 * deno run -A tests/backends/k8s/_interop_child.ts '<ChildConfig as JSON>'
 */
import { readFile } from "node:fs/promises";
import process from "node:process";
import { createInterface } from "node:readline";
import { Allocator } from "../../../mod.ts";
import { K8sBackend } from "../../../src/backends/k8s/mod.ts";
import { Labels } from "../../../src/identity/mod.ts";

/** What the test tells the child. */
export interface ChildConfig {
  readonly kubeconfig: string;
  readonly context: string;
  readonly node: string;
  readonly labels: string;
  readonly concurrency: number;
  readonly leaseTtlMs: number;
  readonly heartbeatTimeoutMs?: number;
  readonly syncIntervalMs?: number;
}

/** The child's report of its allocations. */
export interface ChildResult {
  readonly ids: Record<string, number>;
  /** Keys whose identity this node created. */
  readonly created: string[];
  readonly errors: string[];
  readonly t0: number;
  readonly t1: number;
}

/** The child's answers after the race. */
export interface ChildAnswers {
  readonly answers: Record<string, number | null>;
  /** Held keys moved to another ID (`reassigned`). */
  readonly reassigned: number;
}

const say = (o: unknown) => console.log(JSON.stringify(o));

async function allocateAll(
  alloc: Allocator<string>,
  keys: readonly string[],
  concurrency: number,
): Promise<ChildResult> {
  const result: ChildResult = { ids: {}, created: [], errors: [], t0: Date.now(), t1: 0 };
  let next = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < keys.length) {
      const key = keys[next++];
      try {
        const r = await alloc.allocate(key);
        result.ids[key] = r.id;
        if (r.isNew) result.created.push(key);
      } catch (err) {
        result.errors.push(`${key}: ${err}`);
      }
    }
  }));
  return { ...result, t1: Date.now() };
}

/** Serves the commands of stdin until `end` (or stdin's end); closes the node. */
async function main(config: ChildConfig): Promise<void> {
  const sets = JSON.parse(await readFile(config.labels, "utf8")) as string[][];
  const keys = sets.map((s) => Labels.parse(s).toKvstoreString());
  await using backend = await K8sBackend.connect({
    node: config.node,
    kubeconfig: config.kubeconfig,
    context: config.context,
    namespace: "default", // _cilium.ts's NAMESPACE
    maxClockSkewMs: 500,
    ...(config.heartbeatTimeoutMs ? { heartbeatTimeoutMs: config.heartbeatTimeoutMs } : {}),
  });
  await using alloc = await Allocator.open(backend, {
    min: 256,
    max: 65535,
    leaseTtlMs: config.leaseTtlMs,
    maxAttempts: 64,
    ...(config.syncIntervalMs ? { syncIntervalMs: config.syncIntervalMs } : {}),
  });
  await alloc.waitForInitialSync();
  say({ ready: true });
  for await (const command of createInterface({ input: process.stdin })) {
    if (command === "end") break;
    if (command.startsWith("go ")) {
      const wait = Number(command.slice(3)) - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      say(await allocateAll(alloc, keys, config.concurrency));
    }
    if (command === "answers") {
      const answers: Record<string, number | null> = {};
      for (const key of keys) answers[key] = (await alloc.get(key)) ?? null;
      say({ answers, reassigned: alloc.status().fence.reassigned } satisfies ChildAnswers);
    }
  }
}

if (import.meta.main) {
  await main(JSON.parse(process.argv[2]) as ChildConfig);
  // stdin's reader would keep the process alive after `end`.
  process.exit(0);
}
