/**
 * The Kubernetes nemesis hooks: every fault of the nemesis's own — worker kills and stalls, lease
 * revocation (the node's Lease deleted or its epoch changed by an outsider), garbage — and the
 * store's own: API-server restarts, an etcd restart under the API server, forced watch expiry
 * (`410`) (`./nemesis_faults.ts`). Each run gets a private kube-apiserver with Cilium's CRDs
 * (`cilium.io`), the workers' Leases and claims in namespace `default`, reached through an admin
 * kubeconfig; the store checks read it through the backend's layout (`./nemesis_read.ts`).
 *
 * A worker killed and restarted under its name opens its session with `restart` (issue 28's rule:
 * it is that node restarting), as a supervisor would start it: its old Lease is still live.
 *
 * @module
 */
import type { Backend, SessionOptions } from "../../../allocator/backend.ts";
import type {
  GrowthSample,
  NemesisHooks,
  NemesisRunStore,
  NemesisStoreSpec,
  NemesisWorkload,
  OpenedBackend,
} from "../../../testing/nemesis.ts";
import { NEMESIS_FAULTS } from "../../../testing/nemesis.ts";
import { K8sBackend } from "../backend.ts";
import { createKubeClient } from "../client.ts";
import { loadKubeconfig } from "../kubeconfig.ts";
import { type KubeTestCluster, startKubeApiServer } from "./cluster.ts";
import { K8S_STORE_FAULTS } from "./nemesis_faults.ts";
import { API_SERVER_READY_MS } from "./nemesis_retry.ts";
import { K8S_GARBAGE } from "./nemesis_garbage.ts";
import { checkK8sGrowth } from "./nemesis_read.ts";
import { type K8sNemesisSpec, K8sNemesisStore, k8sSpec } from "./nemesis_store.ts";

/** The kubeconfig context every nemesis process uses. */
const CONTEXT = "nemesis";
/** The namespace of the node Leases and key claims. */
const NAMESPACE = "default";
/** The workers' request timeout (a call's own deadline is 10 s). */
const REQUEST_TIMEOUT_MS = 3_000;
/**
 * The workers' lease, on either workload: 5 s, not etcd's 3 s. A renewal here is an API write
 * (every third of the TTL), which a busy 2-core machine's API server answered in up to 1–2 s:
 * with 3 s leases, renewals came too late for the skew margin several times a minute with no
 * fault at all. Durations are whole seconds on the API server anyway.
 */
const LEASE_TTL_MS = 5_000;
/**
 * Cilium operator's heartbeat timeout beside Cilium CRD-mode nodes: the run's operator GC and
 * idalloc's nodes and GC all use it, short (Cilium's default is 30 min) so that the operator marks
 * and deletes many times in a run. Twice the lease: idalloc renews (and unmarks what it holds)
 * every third of its lease, well within it.
 */
export const CILIUM_HEARTBEAT_TIMEOUT_MS = 10_000;
/** The growth run's clock-skew margin: the default workload's. */
const GROWTH_SKEW_MS = 500;

/** A private API server (Cilium's CRDs installed) and the spec that reaches it. */
async function startServer(
  skewMs: number,
  cilium = false,
): Promise<{ cluster: KubeTestCluster; spec: K8sNemesisSpec }> {
  const cluster = await startKubeApiServer({ readyTimeoutMs: API_SERVER_READY_MS });
  try {
    const kubeconfig = await cluster.kubeconfig("admin", {
      context: CONTEXT,
      namespace: NAMESPACE,
    });
    const spec: K8sNemesisSpec = {
      kind: "k8s",
      kubeconfig,
      context: CONTEXT,
      namespace: NAMESPACE,
      group: "cilium.io",
      maxClockSkewMs: skewMs,
      requestTimeoutMs: REQUEST_TIMEOUT_MS,
      ...(cilium ? { heartbeatTimeoutMs: CILIUM_HEARTBEAT_TIMEOUT_MS } : {}),
    };
    return { cluster, spec };
  } catch (err) {
    await cluster.close();
    throw err;
  }
}

/** A run's store: its own API server, stopped with the store (its log kept under `dir`). */
async function startRun(dir: string, workload: NemesisWorkload): Promise<NemesisRunStore> {
  const { cluster, spec } = await startServer(workload.clockSkewMs, workload.cilium === true);
  try {
    return new K8sNemesisStore(spec, await cluster.client("admin", NAMESPACE), cluster, dir);
  } catch (err) {
    await cluster.close();
    throw err;
  }
}

/** The store `spec` names (a reader of it: the growth worker's counts). */
async function openStore(spec: NemesisStoreSpec): Promise<K8sNemesisStore> {
  const s = k8sSpec(spec);
  const client = await createKubeClient(await loadKubeconfig(s.kubeconfig, s.context));
  return new K8sNemesisStore(s, client);
}

/**
 * `backend`, opening its sessions with `restart`: a nemesis process under a node name is that
 * node (re)starting, never a second process beside it (the nemesis ends one before it starts the
 * next under the name).
 */
function restarting(backend: K8sBackend): Backend {
  return {
    kind: backend.kind,
    node: backend.node,
    checkKey: (key) => backend.checkKey(key),
    openSession: (options: SessionOptions) => backend.openSession({ ...options, restart: true }),
    admin: () => backend.admin(),
  };
}

async function openBackend(spec: NemesisStoreSpec, node: string): Promise<OpenedBackend> {
  const s = k8sSpec(spec);
  const backend = await K8sBackend.connect({
    node,
    kubeconfig: s.kubeconfig,
    context: s.context,
    namespace: s.namespace,
    resource: { group: s.group },
    maxClockSkewMs: s.maxClockSkewMs,
    requestTimeoutMs: s.requestTimeoutMs,
    ...(s.heartbeatTimeoutMs === undefined ? {} : { heartbeatTimeoutMs: s.heartbeatTimeoutMs }),
  });
  return { backend: restarting(backend), [Symbol.asyncDispose]: () => backend.close() };
}

/** The Kubernetes nemesis hooks. */
export const k8sNemesis: NemesisHooks = {
  faults: NEMESIS_FAULTS,
  storeFaults: K8S_STORE_FAULTS,
  garbageKinds: K8S_GARBAGE,
  // The API server's start (7–15 s on 2 quiet cores), 4 workers' connects, the settle (a 5 s
  // lease), the probe and the drain. On a 2-core machine shared by others (load 20–40) it was
  // 65–100 s: runs there take longer than `--seconds`, as the report says.
  overhead: { fixed: 40, share: 0.02 },
  // Beside Cilium CRD-mode nodes (`store.ciliumCrd`), not Cilium's kvstore.
  cilium: true,
  timings: (_name, timings) => ({ ...timings, leaseTtlMs: LEASE_TTL_MS }),
  startRun,
  async startGrowth() {
    const { cluster, spec } = await startServer(GROWTH_SKEW_MS);
    return { spec, [Symbol.asyncDispose]: () => cluster.close() };
  },
  openStore,
  openBackend,
  growth: {
    check: checkK8sGrowth,
    columns: ["masters", "refs", "dead refs", "marked", "claims", "leases"],
    row(s: GrowthSample): string[] {
      const c = (name: string) => String(s.counts[name] ?? 0);
      return [c("id"), c("ref"), c("ref (dead)"), c("marked"), c("claim"), c("lease")];
    },
  },
};
