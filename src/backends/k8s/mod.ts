/**
 * The Kubernetes backend of idalloc, in Cilium's CRD layout (`identity-allocation-mode: crd`):
 * {@linkcode K8sBackend}.
 *
 * | Object | What it holds |
 * |---|---|
 * | `CiliumIdentity` `<ID>` (cluster-scoped) | `security-labels`: the key (a label set as its map, any other key as `idalloc:key` → key); `metadata.labels`: its Kubernetes-valid `k8s:` labels |
 * | annotation `ref.idalloc.io/<node>` on it | the node's reference: its Lease's epoch |
 * | annotation `io.cilium.heartbeat` on it | Cilium's GC mark: unused since then |
 * | `Lease` `idalloc-node-<node>` (namespace) | the node's liveness: `renewTime` + duration, annotation `idalloc.io/epoch` |
 * | `Lease` `idalloc-key-<hash>` (namespace) | the key's claim: the ID idalloc nodes create for it |
 *
 * Creating an identity by name is the allocation (a taken name is another ID), as in Cilium; a
 * key's ID is Cilium's answer, the oldest identity of it, so idalloc and Cilium's CRD-mode agents
 * answer alike. A reference is live while its node's Lease is live and carries its epoch. GC marks
 * an unused identity with Cilium's own annotation and deletes it a grace later with a
 * resource-version precondition; a node removes the mark from what it holds.
 *
 * @example Allocate an identity on Kubernetes
 * ```ts
 * import { Allocator } from "@idalloc/idalloc";
 * import { K8sBackend } from "@idalloc/idalloc/k8s";
 *
 * // Needs an API server: a function here, so that the doc tests type-check it without calling it.
 * async function webIdentity(): Promise<number> {
 *   await using backend = await K8sBackend.connect({ node: "10.0.0.1", kubeconfig: "kubeconfig" });
 *   await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *   const { id } = await alloc.allocate("k8s:app=web;");
 *   return id;
 * }
 * ```
 *
 * @module
 */
export { K8sBackend, type K8sConnectOptions } from "./backend.ts";
export type {
  K8sBackendOptions,
  K8sEndpointResourceOptions,
  K8sEndpointSliceResourceOptions,
  K8sResourceOptions,
} from "./options.ts";
export { MAX_KEY_BYTES, MAX_REFS_PER_NODE } from "./limits.ts";
export { NodeInUseError } from "../../errors.ts";
// The coordination namespace (`namespace` option) and the clock check of a writable session.
export {
  CoordinationNamespaceError,
  DEFAULT_NAMESPACE,
  NamespaceNotFoundError,
} from "./coordination.ts";
export { ClockSkewError } from "./clock.ts";
// The base classes of the errors above, so that this entrypoint's docs are complete.
export { IdallocError, type IdallocErrorOptions } from "../../errors.ts";
// The API client, for callers that bring their own (K8sConnectOptions.client).
export { createKubeClient } from "./client.ts";
export type * from "./client.ts";
export {
  defaultKubeconfigPaths,
  type ExecApiVersion,
  type ExecClusterInfo,
  type ExecPlugin,
  inClusterConnection,
  type InClusterPaths,
  type KubeConnection,
  loadKubeconfig,
} from "./kubeconfig.ts";
export type { HealthCheckOptions } from "./client_pool.ts";
export {
  CredentialPluginError,
  KubeApiError,
  type KubeStatus,
  type KubeStatusDetails,
  type KubeStatusReason,
  NotIdentityResourceError,
  NotKubernetesApiError,
  ResourceNotInstalledError,
} from "./errors.ts";
export {
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  StoreUnavailableError,
  type TlsProblem,
} from "../../errors.ts";
export type * from "../../allocator/backend.ts";
export type * from "../../allocator/damage.ts";
