/**
 * `deno task bench k8s-memory [--sizes 10000,100000] [--real 10000]`: the heap a Kubernetes
 * session keeps per identity, the budget of its index (issue 37). Each measurement is a fresh
 * process run with `--v8-flags=--expose-gc,--no-flush-bytecode`: the backend is connected first, the heap measured
 * after full collections, then a read-only session (the informer and its index) or a read-only
 * `Allocator` on it (index + the core's cache and pool) is opened and synced, and the heap
 * measured again; the difference over the identity count is the retained bytes per identity.
 *
 * Two ways in, both through the real code path from the list's JSON text on (the client parses
 * the body with `JSON.parse`; the informer reads each object with `readIdentity` into its index,
 * the allocator's feed into its cache):
 *
 * - **fed** (`--sizes`): a client double answers the informer's list with the JSON text of the
 *   identities as kube-apiserver v1.20 serves them (`managedFields`, `uid`, timestamps: the
 *   whole object), parsed there, and watches nothing. Creating 100,000 objects on the API server
 *   of a 2-core machine takes minutes; this measures the same retention in seconds.
 * - **real** (`--real N`): N identities created on a private kube-apiserver, listed by the real
 *   client; the check that the fed shape retains what a real list does.
 *
 * Identities carry three labels each, as `deno task bench scale` (whose kvstore figure, about
 * 0.5 KB per identity in the core's cache, is the comparison).
 *
 * @module
 */
import process from "node:process";
import { Allocator } from "../mod.ts";
import { K8sBackend, type KubeClient, type KubeObject } from "../src/backends/k8s/mod.ts";
import { benchIdentityObject, syncedIndexSession } from "../src/backends/k8s/testing/bench.ts";
import {
  findKubeApiserver,
  identityResource,
  startKubeApiServer,
} from "../src/backends/k8s/testing/cluster.ts";
import { Labels } from "../src/identity/mod.ts";
import type { BenchRow } from "./_table.ts";
import { bytes, round } from "./k8s_scale_table.ts";

/** The first ID of the measured identities. */
const FIRST_ID = 1_000;
/** Creates in flight while filling the real API server. */
const FILL_WIDTH = 32;
const KIND = { apiVersion: "cilium.io/v2", kind: "CiliumIdentity" };

/** A measuring child's task. */
export interface MemoryTask {
  /** `fed`: a client double serves the list; `real`: the API server of `kubeconfig`. */
  readonly mode: "fed" | "real";
  /** Identities. */
  readonly n: number;
  /** What is opened: a read-only session (its informer's index), or a read-only allocator. */
  readonly layer: "index" | "allocator";
  /** The real server's kubeconfig. */
  readonly kubeconfig?: string;
}

/** A child's answer: heap before and after, bytes. */
export interface MemoryAnswer {
  readonly before: number;
  readonly after: number;
  readonly n: number;
}

/** A measuring child that failed. */
export class MemoryBenchError extends Error {
  /** @param message What happened. */
  constructor(message: string) {
    super(message);
    this.name = "MemoryBenchError";
  }
}

/** The key of identity `i`: three labels, as `bench/scale.ts`'s. */
export function keyOf(i: number): string {
  return Labels.parse([
    `k8s:app=scale-${i}`,
    `k8s:io.kubernetes.pod.namespace=ns-${i % 100}`,
    "k8s:io.cilium.k8s.policy.cluster=default",
  ]).toKvstoreString();
}

/** Identity `i` as an idalloc node creates it. */
function created(i: number): KubeObject {
  return benchIdentityObject(KIND, FIRST_ID + i, keyOf(i), {
    "idalloc.io/creator": `node-${i % 50}/0123456789abcdef`,
    "idalloc.io/lease-namespace": "idalloc-system",
  });
}

/** `fields` as server-side apply's FieldsV1 (`{"f:a": {}, ".": {}}`). */
function fieldsOf(map: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries([[".", {}], ...Object.keys(map).map((k) => [`f:${k}`, {}])]);
}

/** Identity `i` as kube-apiserver v1.20 serves it: the created object plus the server's fields. */
export function served(i: number): KubeObject {
  const obj = created(i);
  const meta = obj.metadata;
  const at = new Date(Date.UTC(2026, 10, 1) + i * 1_000).toISOString().replace(/\.\d+Z$/, "Z");
  return {
    ...obj,
    metadata: {
      ...meta,
      creationTimestamp: at,
      generation: 1,
      managedFields: [{
        apiVersion: KIND.apiVersion,
        fieldsType: "FieldsV1",
        fieldsV1: {
          "f:metadata": {
            "f:annotations": fieldsOf(meta.annotations ?? {}),
            "f:labels": fieldsOf(meta.labels ?? {}),
          },
          "f:security-labels": fieldsOf(obj["security-labels"] as Record<string, unknown>),
        },
        manager: "deno",
        operation: "Update",
        time: at,
      }],
      resourceVersion: String(100_000 + i),
      uid: crypto.randomUUID(),
    },
  };
}

/**
 * A client that answers the informer's list with `n` served identities, parsed from their JSON
 * text on each call (as the real client parses the body), and keeps nothing; watches wait.
 */
function fedClient(n: number): KubeClient {
  const never = (signal?: AbortSignal) =>
    new Promise<void>((resolve) => signal?.addEventListener("abort", () => resolve()));
  return {
    server: "https://fed.invalid",
    namespace: "default",
    source: "k8s-memory",
    list() {
      const parts: string[] = [];
      for (let i = 0; i < n; i++) parts.push(JSON.stringify(served(i)));
      const text = `{"kind":"CiliumIdentityList","apiVersion":"cilium.io/v2",` +
        `"metadata":{"resourceVersion":"${100_000 + n}"},"items":[${parts.join(",")}]}`;
      const body = JSON.parse(text) as {
        items: KubeObject[];
        metadata: { resourceVersion: string };
      };
      return Promise.resolve({ items: body.items, resourceVersion: body.metadata.resourceVersion });
    },
    watch: (_res: unknown, o: { signal?: AbortSignal }) => ({
      // No events: the watch waits until the session closes.
      async *[Symbol.asyncIterator]() {
        await never(o.signal);
        yield* [];
      },
    }),
    probe: () =>
      Promise.resolve({ version: { major: "1", minor: "20", gitVersion: "v1.20.2" }, missing: [] }),
    version: () => Promise.resolve({ major: "1", minor: "20", gitVersion: "v1.20.2" }),
    close: () => Promise.resolve(),
    [Symbol.asyncDispose]: () => Promise.resolve(),
  } as unknown as KubeClient;
}

/** The heap after full collections. */
function heap(): number {
  const gc = (globalThis as { gc?: () => void }).gc;
  if (gc === undefined) throw new MemoryBenchError("run with --v8-flags=--expose-gc");
  for (let i = 0; i < 4; i++) gc();
  return Deno.memoryUsage().heapUsed;
}

/** The child's measurement (see the module doc). */
async function measure(task: MemoryTask): Promise<MemoryAnswer> {
  const backend = await K8sBackend.connect({
    node: "memory",
    endpoints: false,
    ...(task.kubeconfig ? { kubeconfig: task.kubeconfig, context: "test" } : {}),
  }, task.mode === "fed" ? { client: fedClient(task.n) } : {});
  const synced = () => syncedIndexSession(backend, AbortSignal.timeout(600_000));
  // Anything the first list touches once (lazy module state, the client's pool) is warmed by a
  // session over the same store before the baseline.
  await (await synced()).session.close();
  const before = heap();
  let keep: unknown;
  if (task.layer === "index") {
    const { session, indexed } = await synced();
    if (indexed !== task.n) {
      throw new MemoryBenchError(`the index holds ${indexed} of ${task.n}`);
    }
    keep = session;
  } else {
    const alloc = await Allocator.open(backend, {
      min: 256,
      max: FIRST_ID + task.n + 1_000,
      readOnly: true,
    });
    await alloc.waitForInitialSync();
    keep = alloc;
  }
  const after = heap();
  // Alive until measured.
  if (keep === undefined) throw new MemoryBenchError("nothing opened");
  return { before, after, n: task.n };
}

/** Runs `task` in a fresh process with `--expose-gc`. */
async function child(task: MemoryTask): Promise<MemoryAnswer> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      // No bytecode flushing: V8 drops the bytecode of functions unused for a few collections,
      // which between the two measurements would free a megabyte or so of unrelated heap.
      "--v8-flags=--expose-gc,--no-flush-bytecode,--max-old-space-size=4096",
      new URL(import.meta.url).pathname,
      JSON.stringify(task),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim().split("\n").at(-1) ?? "";
  if (out.code !== 0) throw new MemoryBenchError(`the ${task.mode} child at ${task.n} failed`);
  return JSON.parse(text) as MemoryAnswer;
}

/** Bytes per identity of `answer`, less the fixed cost `empty` measured at 0. */
function perIdentity(answer: MemoryAnswer, empty: MemoryAnswer): number {
  return (answer.after - answer.before - (empty.after - empty.before)) / answer.n;
}

/** Fills a private API server with `n` identities; its admin kubeconfig and a closer. */
async function realServer(n: number) {
  const cluster = await startKubeApiServer({ attempts: 2, readyTimeoutMs: 180_000 });
  try {
    const client = await cluster.client("admin");
    const res = identityResource("cilium.io");
    let next = 0;
    await Promise.all(Array.from({ length: FILL_WIDTH }, async () => {
      while (next < n) await client.create(res, created(next++));
    }));
    await client.close();
    const kubeconfig = await cluster.kubeconfig("admin", { context: "test", namespace: "default" });
    return { kubeconfig, close: () => cluster.close() };
  } catch (err) {
    await cluster.close();
    throw err;
  }
}

/** The options of the `k8s-memory` group. */
export interface MemoryOptions {
  /** Identity counts fed through the client double. */
  readonly sizes: readonly number[];
  /** Identities created on a real API server (none: skipped). */
  readonly real?: number;
}

/** Takes `--sizes` and `--real` out of `args` (in place). */
export function parseMemoryArgs(args: string[]): MemoryOptions {
  const take = (flag: string) => {
    const at = args.indexOf(flag);
    return at === -1 ? undefined : args.splice(at, 2)[1];
  };
  const sizes = take("--sizes")?.split(",").map(Number) ?? [10_000, 100_000];
  const real = take("--real");
  if (sizes.some((n) => !Number.isSafeInteger(n) || n < 1)) {
    throw new MemoryBenchError("--sizes takes whole numbers ≥ 1, separated by commas");
  }
  return { sizes, ...(real === undefined ? {} : { real: Number(real) }) };
}

/** The `k8s-memory` group's rows. */
export async function benchK8sMemory(o: MemoryOptions): Promise<BenchRow[]> {
  const rows: BenchRow[] = [];
  const row = (name: string, answer: MemoryAnswer, empty: MemoryAnswer) => {
    const per = perIdentity(answer, empty);
    const value = `${bytes(per)}/identity (${round(per)} B; heap ${bytes(answer.before)} → ` +
      `${bytes(answer.after)})`;
    console.error(`  k8s-memory: ${name}: ${value}`);
    rows.push({ name: `k8s-memory ${name}`, value });
  };
  for (const layer of ["index", "allocator"] as const) {
    const empty = await child({ mode: "fed", n: 0, layer });
    for (const n of o.sizes) {
      row(
        `fed, ${layer}, ${n.toLocaleString("en-US")}`,
        await child({ mode: "fed", n, layer }),
        empty,
      );
    }
  }
  if (o.real !== undefined) {
    if (findKubeApiserver() === undefined) {
      rows.push({ name: "k8s-memory real", value: "skipped: kube-apiserver is not built" });
      return rows;
    }
    const server = await realServer(o.real);
    try {
      const { kubeconfig } = server;
      for (const layer of ["index", "allocator"] as const) {
        const empty = await child({ mode: "fed", n: 0, layer });
        const answer = await child({ mode: "real", n: o.real, layer, kubeconfig });
        row(`real API server, ${layer}, ${o.real.toLocaleString("en-US")}`, answer, empty);
      }
    } finally {
      await server.close();
    }
  }
  return rows;
}

if (import.meta.main) {
  try {
    const answer = await measure(JSON.parse(process.argv[2]) as MemoryTask);
    console.log(JSON.stringify(answer));
  } catch (err) {
    console.error(err instanceof Error ? err.stack : String(err));
    process.exit(1);
  }
  process.exit(0);
}
