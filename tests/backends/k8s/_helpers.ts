/**
 * Helpers of the Kubernetes backend's tests on a real API server: the run's one `kube-apiserver`
 * (`sharedKubeApiServer`: the test launcher's, else one per test process), and per test a fixture
 * of its own — copies of Cilium's CRDs under a random group no other fixture uses meanwhile (an
 * emptied one of the run's pool on the shared server: `crd_pool.ts`), a fresh namespace for the
 * Leases — so tests never see each other. A fixture empties its group (or deletes its CRDs) when
 * disposed: every test process of a run shares the server.
 */
import type { AllocatorOptions } from "../../../src/allocator/types.ts";
import type { SessionOptions } from "../../../src/allocator/backend.ts";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import type { KubeClient, KubeObject, KubeResource } from "../../../src/backends/k8s/kube.ts";
import {
  heldRemovalPatch,
  type IdentityRecord,
  readIdentity,
  readNodeRefs,
  refsName,
} from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import type { K8sBackendOptions } from "../../../src/backends/k8s/options.ts";
import { listAll } from "../../../src/backends/k8s/paging.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";
import {
  kubeApiserverUnavailable,
  type KubeTestCluster,
  sharedKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { fixtureGroupPool, takeFixtureGroup } from "../../../src/backends/k8s/testing/crd_pool.ts";
import { NAMESPACE_RESOURCE } from "../../../src/backends/k8s/testing/crds.ts";

export { eventually } from "../../_support/eventually.ts";

/** Registers a test on the real API server; skipped (loudly) when it is not built. */
export function k8sTest(name: string, fn: () => Promise<void>): void {
  Deno.test({ name, ignore: kubeApiserverUnavailable() !== undefined, fn });
}

/** The run's API server (see `sharedKubeApiServer`). */
export function sharedCluster(): Promise<KubeTestCluster> {
  return sharedKubeApiServer();
}

/** Events of a watch, collected in the background until `stop()`. */
export interface Collected<T> {
  /** What arrived so far. */
  readonly events: T[];
  /** Ends the watch and waits for it. */
  stop(): Promise<void>;
}

/** Collects what `watch(signal)` yields until `stop()`. */
export function collect<T>(watch: (signal: AbortSignal) => AsyncIterable<T>): Collected<T> {
  const controller = new AbortController();
  const events: T[] = [];
  const running = (async () => {
    for await (const ev of watch(controller.signal)) events.push(ev);
  })();
  return {
    events,
    stop: async () => {
      controller.abort();
      await running;
    },
  };
}

/** A generous deadline for one call in a test. */
export function deadline(ms = 20_000): AbortSignal {
  return AbortSignal.timeout(ms);
}

/** A test's own identity resource and namespace on the shared server. */
export interface K8sFixture extends AsyncDisposable {
  readonly cluster: KubeTestCluster;
  /** An admin client (not closed by the backends made here). */
  readonly client: KubeClient;
  readonly group: string;
  readonly namespace: string;
  readonly identities: KubeResource;
  readonly endpoints: KubeResource;
  /** The backend options of `node` in this fixture. */
  options(node: string, extra?: Partial<K8sBackendOptions>): K8sBackendOptions;
  /** A backend of `node` (closed with the fixture). */
  backend(node: string, extra?: Partial<K8sBackendOptions>): Promise<K8sBackend>;
  /** A writable session of `node` with a short lease. */
  session(
    node: string,
    extra?: Partial<K8sBackendOptions>,
    options?: Partial<SessionOptions> & { restart?: boolean },
  ): Promise<K8sSession>;
  /** An allocator of `node` (closed with the fixture). */
  allocator(
    node: string,
    options?: Partial<AllocatorOptions<string>>,
    extra?: Partial<K8sBackendOptions>,
  ): Promise<Allocator<string>>;
  /** The identity object `id`, read directly. */
  identity(id: number): Promise<KubeObject | undefined>;
  /** Every readable identity, read directly. */
  records(): Promise<IdentityRecord[]>;
  /** Creates an identity directly (as a Cilium node would). */
  createIdentity(id: number, labels: Record<string, string>): Promise<KubeObject>;
  /** Merge-patches identity `id` directly. */
  patchIdentity(id: number, body: unknown): Promise<KubeObject>;
  /** `node`'s references as its reference object stores them (ID → epoch), read directly. */
  held(node: string): Promise<Map<number, string>>;
  /** Removes `node`'s reference to `id` from its reference object directly (as an operator would). */
  dropHeld(node: string, id: number): Promise<void>;
  /** Creates a CiliumEndpoint naming identity `id` (as a Cilium agent would). */
  endpoint(name: string, id: number): Promise<void>;
  /**
   * Creates a CiliumEndpointSlice whose entries name `ids` (as Cilium's operator does with CES
   * enabled); the first call installs the fixture's CiliumEndpointSlice CRD.
   */
  endpointSlice(name: string, ids: readonly number[]): Promise<void>;
}

/** A fresh fixture (see the module doc) on the shared server, or on `own`. */
export async function fixture(own?: KubeTestCluster): Promise<K8sFixture> {
  const cluster = own ?? await sharedCluster();
  const suffix = crypto.randomUUID().slice(0, 8);
  const namespace = `idalloc-${suffix}`;
  // A group of the run's pool on the shared server; a server of the test's own gets a new one.
  const fixtureGroup = await takeFixtureGroup(cluster, {
    pool: own === undefined ? fixtureGroupPool() : undefined,
  });
  const { group, identities, endpoints } = fixtureGroup;
  const client = await cluster.client("admin") as unknown as KubeClient & {
    close(): Promise<void>;
  };
  await client.create(NAMESPACE_RESOURCE, {
    apiVersion: "v1",
    kind: "Namespace",
    metadata: { name: namespace },
  }, { signal: deadline() });
  const closers: (() => Promise<void>)[] = [];
  const options = (node: string, extra: Partial<K8sBackendOptions> = {}): K8sBackendOptions => ({
    node,
    namespace,
    resource: { group },
    maxClockSkewMs: 500,
    ...extra,
  });
  const backend = async (node: string, extra?: Partial<K8sBackendOptions>) => {
    const b = await K8sBackend.connect(options(node, extra), { client });
    closers.push(() => b.close());
    return b;
  };
  return {
    cluster,
    client,
    group,
    namespace,
    identities,
    endpoints,
    options,
    backend,
    async session(node, extra, sessionOptions = {}) {
      const b = await backend(node, extra);
      return await b.openSession({
        leaseTtlMs: 3_000,
        readOnly: false,
        onLeaseReplaced: () => {},
        ...sessionOptions,
      }) as K8sSession;
    },
    async allocator(node, allocatorOptions = {}, extra) {
      const a = await Allocator.open(await backend(node, extra), {
        min: 256,
        max: 65535,
        leaseTtlMs: 3_000,
        ...allocatorOptions,
      });
      closers.push(() => a.close());
      return a;
    },
    identity: (id) => client.get(identities, String(id), { signal: deadline() }),
    async records() {
      const { items } = await listAll(client, identities, { signal: deadline() });
      return items.map(readIdentity).flatMap((r) => (r.ok ? [r.record] : []));
    },
    createIdentity: (id, labels) =>
      client.create(identities, {
        apiVersion: `${group}/v2`,
        kind: "CiliumIdentity",
        metadata: { name: String(id) },
        "security-labels": labels,
      }, { signal: deadline() }),
    patchIdentity: (id, body) =>
      client.patch(identities, String(id), body, { type: "merge", signal: deadline() }),
    async held(node) {
      const obj = await client.get(LEASES, refsName(node), { namespace, signal: deadline() });
      return new Map(obj === undefined ? [] : readNodeRefs(obj)?.refs ?? []);
    },
    async dropHeld(node, id) {
      const obj = await client.get(LEASES, refsName(node), { namespace, signal: deadline() });
      const annotations = obj && heldRemovalPatch(readNodeRefs(obj)!, { ids: new Set([id]) });
      if (annotations === undefined) throw new Error(`${node} holds no reference to ${id}`);
      await client.patch(LEASES, refsName(node), {
        metadata: { resourceVersion: obj!.metadata.resourceVersion, annotations },
      }, { type: "merge", namespace, signal: deadline() });
    },
    async endpoint(name, id) {
      await client.create(endpoints, {
        apiVersion: `${group}/v2`,
        kind: "CiliumEndpoint",
        metadata: { name },
        status: { id: 1, identity: { id, labels: [] }, state: "ready" },
      }, { namespace, signal: deadline() });
    },
    async endpointSlice(name, ids) {
      const resource = await fixtureGroup.endpointSlices();
      await client.create(resource, {
        apiVersion: `${group}/v2alpha1`,
        kind: "CiliumEndpointSlice",
        metadata: { name },
        namespace,
        endpoints: ids.map((id, i) => ({
          name: `${name}-pod-${i}`,
          id,
          networking: { addressing: [{ ipv4: `10.0.0.${i + 1}` }], node: "192.168.0.1" },
        })),
      }, { signal: deadline() });
    },
    async [Symbol.asyncDispose]() {
      // Allocators first (they close their sessions), then the backends.
      for (const close of closers.reverse()) await close().catch(() => {});
      await fixtureGroup.release(client);
      await client.close();
    },
  };
}
