/**
 * Helpers of the interop tests beside real Cilium v1.16 CRD-mode nodes: registration that skips
 * loudly without the API server or the Cilium build, Cilium-style label sets, idalloc nodes in
 * child processes, and the store read as Cilium's own lookup reads it (every identity of a label
 * set, the oldest `creationTimestamp` first) with who created each one.
 */
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { readIdentity } from "../../../src/backends/k8s/layout.ts";
import { listAll } from "../../../src/backends/k8s/paging.ts";
import type { KubeClient, KubeObject } from "../../../src/backends/k8s/kube.ts";
import {
  type CiliumCrdNode,
  ciliumCrdNode,
  ciliumCrdUnavailable,
  startCiliumCluster,
} from "../../../src/backends/k8s/testing/cilium.ts";
import {
  identityResource,
  kubeApiserverUnavailable,
  type KubeTestCluster,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { Labels } from "../../../src/identity/mod.ts";
import { ScriptProcess } from "../../_support/script_process.ts";
import type { ChildAnswers, ChildConfig, ChildResult } from "./_interop_child.ts";

/** Cilium's identities (`cilium.io/v2`), the resource its generated clientset uses. */
export const CILIUM_IDENTITIES = identityResource();
/** Cilium's endpoints. */
export const CILIUM_ENDPOINTS = {
  group: "cilium.io",
  version: "v2",
  plural: "ciliumendpoints",
  namespaced: true,
  kind: "CiliumEndpoint",
} as const;

/** The field manager Cilium's node writes as (its client-go user agent's program name). */
export const CILIUM_MANAGER = "interop116";

/** Registers a test that needs the API server and Cilium's CRD-mode node; skipped loudly without. */
export function ciliumTest(name: string, fn: (t: Deno.TestContext) => Promise<void>): void {
  const ignore = kubeApiserverUnavailable() !== undefined || ciliumCrdUnavailable() !== undefined;
  Deno.test({ name, ignore, fn });
}

/** The node (the test is registered only where it is built). */
function cilium(): CiliumCrdNode {
  const node = ciliumCrdNode();
  if (!("bin" in node)) throw new Error(node.why);
  return node;
}

/** A test's world: an API server with Cilium's CRDs, an admin client, a kubeconfig, a temp dir. */
export interface InteropWorld extends AsyncDisposable {
  readonly cluster: KubeTestCluster;
  readonly client: KubeClient;
  readonly node: CiliumCrdNode;
  /** Admin kubeconfig: Cilium's nodes use its current context, idalloc's the context `test`. */
  readonly kubeconfig: string;
  /** Writes label sets as Cilium's node reads them (`-labels`); the file's path. */
  labels(sets: readonly (readonly string[])[]): Promise<string>;
  /** Creates a CiliumEndpoint naming identity `id`, as a Cilium agent does for a pod. */
  endpoint(name: string, id: number): Promise<void>;
}

/** Namespace of the idalloc nodes' Leases and of the test's CiliumEndpoints. */
export const NAMESPACE = "default";

/** Starts an API server with Cilium's own CRDs (one per test: Cilium's group is fixed). */
export async function world(): Promise<InteropWorld> {
  const node = cilium();
  const cluster = await startCiliumCluster(node);
  const dir = await mkdtemp(join(tmpdir(), "idalloc-interop-"));
  const client = await cluster.client("admin");
  let files = 0;
  return {
    cluster,
    client,
    node,
    kubeconfig: await cluster.kubeconfig("admin", { context: "test", namespace: NAMESPACE }),
    async labels(sets) {
      const path = join(dir, `labels-${++files}.json`);
      await writeFile(path, JSON.stringify(sets));
      return path;
    },
    async endpoint(name, id) {
      await client.create(CILIUM_ENDPOINTS, {
        apiVersion: "cilium.io/v2",
        kind: "CiliumEndpoint",
        metadata: { name },
        status: { id: 1, identity: { id, labels: [] }, state: "ready" },
      }, { namespace: NAMESPACE });
    },
    async [Symbol.asyncDispose]() {
      await client.close();
      await cluster.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/**
 * `count` label sets as a Cilium agent derives them from pods: the pod's labels, namespace and
 * service account, sometimes a namespace label (Cilium keeps it out of `metadata.labels`) or a
 * container-runtime label (not a Kubernetes label at all).
 */
export function labelSets(tag: string, count: number): string[][] {
  return Array.from({ length: count }, (_, i) => [
    `k8s:app=${tag}-${i}`,
    `k8s:io.kubernetes.pod.namespace=ns-${i % 7}`,
    `k8s:io.cilium.k8s.policy.serviceaccount=sa-${i % 5}`,
    ...(i % 3 === 0 ? [`k8s:io.cilium.k8s.namespace.labels.team=t${i % 4}`] : []),
    ...(i % 4 === 1 ? [`container:tier=web`] : []),
  ]);
}

/** The key of a label set: Cilium's `GlobalIdentity.GetKey`, idalloc's label-set key. */
export function keyOf(set: readonly string[]): string {
  return Labels.parse([...set]).toKvstoreString();
}

/** An idalloc node in a child process (`_interop_child.ts`). */
export class IdallocProcess implements AsyncDisposable {
  readonly #child: ScriptProcess;

  constructor(config: ChildConfig) {
    this.#child = new ScriptProcess(
      new URL("./_interop_child.ts", import.meta.url).pathname,
      [JSON.stringify(config)],
      { stdin: true },
    );
  }

  /** Waits until its cache is synced. */
  async ready(): Promise<void> {
    const line = await this.#child.nextLine();
    assert.equal(line, JSON.stringify({ ready: true }), this.#child.stderr);
  }

  /** Allocates its label sets from `startAt` (unix ms); its allocations. */
  async allocate(startAt = 0): Promise<ChildResult> {
    this.#command(`go ${startAt}`);
    return this.#parse(await this.#child.nextLine());
  }

  /** Its answer (`get`) for every key, and how many held keys it reassigned. */
  async answers(): Promise<ChildAnswers> {
    this.#command("answers");
    return this.#parse(await this.#child.nextLine());
  }

  /** SIGKILL: the node dies holding its keys. */
  async kill(): Promise<void> {
    this.#child.kill("SIGKILL");
    await this.#child.exited;
  }

  /** Closes the node (its lease is released) and waits for its exit. */
  async end(): Promise<void> {
    this.#command("end");
    await this.#child.success("idalloc node");
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.#child[Symbol.asyncDispose]();
  }

  #command(line: string): void {
    this.#child.writeLine(line);
  }

  #parse<T>(line: string | undefined): T {
    if (line === undefined) throw new Error(`idalloc node ended: ${this.#child.stderr}`);
    return JSON.parse(line) as T;
  }
}

/** One identity as Cilium's lookup and this test see it. */
export interface StoredIdentity {
  readonly id: number;
  readonly key: string;
  /** `creationTimestamp` (ms, second resolution). */
  readonly created: number;
  /** Who created it: the field manager of its `security-labels`. */
  readonly creator: string;
  /** idalloc references (node → epoch). */
  readonly refs: ReadonlyMap<string, string>;
  /** Cilium operator's heartbeat mark, if set. */
  readonly mark?: string;
}

/** The creator of an identity: the manager that set its `security-labels`. */
export function creatorOf(obj: KubeObject): string {
  const fields = (obj.metadata.managedFields ?? []) as {
    manager?: string;
    fieldsV1?: Record<string, unknown>;
  }[];
  return fields.find((f) => f.fieldsV1 && "f:security-labels" in f.fieldsV1)?.manager ?? "?";
}

/** Every identity, grouped by key, each group oldest first (ties: lowest ID, idalloc's rule). */
export async function storeByKey(client: KubeClient): Promise<Map<string, StoredIdentity[]>> {
  const { items } = await listAll(client, CILIUM_IDENTITIES, {
    signal: AbortSignal.timeout(60_000),
  });
  const byKey = new Map<string, StoredIdentity[]>();
  for (const obj of items) {
    const read = readIdentity(obj);
    if (!read.ok) continue;
    const r = read.record;
    const stored: StoredIdentity = {
      id: r.id,
      key: r.key,
      created: r.created,
      creator: creatorOf(obj),
      refs: r.refs,
      ...(r.mark === undefined ? {} : { mark: r.mark }),
    };
    byKey.set(r.key, [...byKey.get(r.key) ?? [], stored]);
  }
  for (const group of byKey.values()) {
    group.sort((a, b) => a.created - b.created || a.id - b.id);
  }
  return byKey;
}

/**
 * Cilium's own lookup (`crdBackend.get`: the oldest `creationTimestamp`): the IDs it may answer
 * for a group — all identities tied at the oldest second, as its sort is not stable.
 */
export function ciliumAnswers(group: readonly StoredIdentity[]): number[] {
  return group.filter((g) => g.created === group[0].created).map((g) => g.id);
}

/** One change of an identity, as a watch saw it. */
export interface IdentityEvent {
  readonly type: "ADDED" | "MODIFIED" | "DELETED";
  readonly id: number;
  /** Cilium operator's heartbeat mark on the object after the change. */
  readonly marked: boolean;
}

/** The changes of Cilium's identities from now on, in etcd's revision order. */
export interface IdentityEvents extends AsyncDisposable {
  readonly events: readonly IdentityEvent[];
  /** ID → the place of its creation among the creations seen. */
  readonly created: ReadonlyMap<number, number>;
  /** Ends the watch. */
  stop(): Promise<void>;
}

/** Watches Cilium's identities from the current version. */
export async function identityEvents(client: KubeClient): Promise<IdentityEvents> {
  let { resourceVersion } = await client.list(CILIUM_IDENTITIES, { limit: 1 });
  const events: IdentityEvent[] = [];
  const created = new Map<number, number>();
  const abort = new AbortController();
  const done = (async () => {
    // A watch the server ends is resumed from the last version seen.
    while (!abort.signal.aborted) {
      for await (
        const event of client.watch(CILIUM_IDENTITIES, { resourceVersion, signal: abort.signal })
      ) {
        if (event.type === "BOOKMARK") continue;
        const meta = event.object.metadata;
        resourceVersion = String(meta.resourceVersion);
        const id = Number(meta.name);
        if (event.type === "ADDED" && !created.has(id)) created.set(id, created.size);
        events.push({ type: event.type, id, marked: HEARTBEAT in (meta.annotations ?? {}) });
      }
    }
  })();
  const stop = async () => {
    abort.abort();
    await done.catch(() => {});
  };
  return { events, created, stop, [Symbol.asyncDispose]: stop };
}

/** Cilium operator's GC mark. */
export const HEARTBEAT = "io.cilium.heartbeat";
