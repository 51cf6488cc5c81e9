/**
 * The etcd backend of idalloc, on `npm:etcd3`, in Cilium's key layout: a store written by
 * Cilium's Go allocator is read as is, and Cilium reads what idalloc writes.
 *
 * - `<prefix>/id/<ID>` → the key (no lease): the ID's master, created only if absent.
 * - `<prefix>/value/<key>/<node>` → the ID (on the node's lease): the node's reference.
 *
 * Allocation is lock-free (etcd ≥ 3.3 range compares and nested transactions): a new key costs
 * one transaction uncontended and at most two under contention, an existing key one. GC deletes
 * are guarded the same way, so GC never deletes an ID a node has just referenced. References
 * share leases (at most 1000 keys each); a lost lease is replaced and the allocator re-creates
 * its references at once.
 *
 * @example Allocate an ID on etcd
 * ```ts
 * import { Allocator } from "@idalloc/idalloc";
 * import { EtcdBackend } from "@idalloc/idalloc/etcd";
 *
 * // Needs a running etcd: a function here, so that the doc tests type-check it without calling it.
 * async function webIdentity(): Promise<number> {
 *   await using backend = await EtcdBackend.connect({
 *     endpoints: ["http://127.0.0.1:2379"],
 *     prefix: "cilium/state/identities/v1",
 *     node: "10.0.0.1",
 *   });
 *   await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *   const { id } = await alloc.allocate("k8s:app=web;");
 *   return id;
 * }
 * ```
 *
 * @module
 */
export { EtcdBackend, type EtcdConnectOptions, type EtcdRequestStats } from "./backend.ts";
export {
  CILIUM_IDENTITIES_PREFIX,
  type EtcdBackendOptions,
  type EtcdTlsOptions,
} from "./options.ts";
export {
  AuthNotEnabledError,
  NotEtcdServerError,
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  type TlsProblem,
} from "./errors.ts";
// The base classes of the errors above, so that this entrypoint's docs are complete.
export { IdallocError, type IdallocErrorOptions, StoreUnavailableError } from "../../errors.ts";
export { MAX_KEY_BYTES } from "./limits.ts";
export type { LimiterStats } from "./request_limiter.ts";
export type * from "../../allocator/backend.ts";
export type * from "../../allocator/damage.ts";
