/**
 * The Kubernetes bench opener: a fresh identity resource and namespace per measurement on the
 * process's private API server (a fixture of `./fixture.ts`), a node's backend on it, and the raw
 * ceiling: one create of an identity by name per key on one client, the write that allocates a
 * new ID in Cilium's CRD mode. The measurement's prefix is not used: each measurement has its own
 * resource.
 *
 * @module
 */
import type { Backend, BackendSession } from "../../../allocator/backend.ts";
import type { BenchHooks, RawWriter } from "../../../testing/bench.ts";
import { K8sBackend } from "../backend.ts";
import { createKubeClient } from "../client.ts";
import { loadKubeconfig } from "../kubeconfig.ts";
import { identityObject } from "../layout.ts";
import { K8sSession } from "../session.ts";
import { identityResource } from "./cluster.ts";
import { k8sSpecStore, K8sStoreFixture } from "./fixture.ts";

async function open(
  where: unknown,
  _prefix: string,
  node: string,
  options?: Record<string, unknown>,
): Promise<Backend & AsyncDisposable> {
  const { kubeconfig, context, namespace, group } = k8sSpecStore(where);
  return await K8sBackend.connect({
    node,
    kubeconfig,
    context,
    namespace,
    resource: { group },
    ...options,
  });
}

async function raw(where: unknown): Promise<RawWriter> {
  const { kubeconfig, context, group } = k8sSpecStore(where);
  const client = await createKubeClient(await loadKubeconfig(kubeconfig, context));
  const identities = identityResource(group);
  const kind = { apiVersion: `${group}/v2`, kind: "CiliumIdentity" };
  return {
    async write(i: number, key: string): Promise<void> {
      // Throws on 409: the raw writer's IDs are its own.
      await client.create(identities, identityObject(kind, 1_000_000 + i, key, {}));
    },
    [Symbol.asyncDispose]: () => client.close(),
  };
}

/** The Kubernetes bench hooks. */
export const k8sBench: BenchHooks = {
  extraCells: () => [],
  async fresh() {
    const fx = await K8sStoreFixture.create();
    return { where: fx.spec().store, [Symbol.asyncDispose]: () => fx[Symbol.asyncDispose]() };
  },
  open,
  raw,
};

/**
 * An identity object as an idalloc node creates it, for benches that feed or fill a store with
 * identities (`bench/k8s_memory.ts`).
 */
export const benchIdentityObject: typeof identityObject = identityObject;

/**
 * A read-only session of `backend` once its informer has listed every identity, and the number of
 * identities its index holds: what `bench/k8s_memory.ts` keeps alive to weigh the index.
 */
export async function syncedIndexSession(
  backend: Backend,
  signal: AbortSignal,
): Promise<{ readonly session: BackendSession; readonly indexed: number }> {
  const session = await backend.openSession({
    leaseTtlMs: 60_000,
    readOnly: true,
    onLeaseReplaced: () => {},
  });
  if (!(session instanceof K8sSession)) {
    await session.close();
    throw new TypeError("not a Kubernetes backend's session");
  }
  await session.informer.waitSynced(signal);
  return { session, indexed: session.informer.index.size };
}
