/**
 * Cilium-style security identities on top of the idalloc allocator: a label set
 * (`k8s:app=web`, `cidr:10.0.0.0/8`, …) becomes a numeric identity that every node of a cluster
 * agrees on. Reserved, well-known and user-reserved identities and node-local (CIDR/FQDN)
 * identities never touch the store; every other label set gets a global identity from the store,
 * in its cluster's range. Remote clusters' identities can be merged in (clustermesh), and every
 * change arrives on one batched stream.
 *
 * The stored keys are byte-for-byte Cilium's (`source:key=value;` per label, sorted by key).
 *
 * @example Allocate, look up and release identities on an embedded Deno KV store
 * ```ts
 * import assert from "node:assert/strict";
 * import { DenoKvBackend } from "@idalloc/idalloc";
 * import { IdentityAllocator, Labels } from "@idalloc/idalloc/identity";
 *
 * using kv = await Deno.openKv(":memory:");
 * const backend = new DenoKvBackend(kv, { prefix: ["identities"], node: "10.0.0.1" });
 * await using identities = await IdentityAllocator.open(backend, { clusterId: 0 });
 *
 * const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
 * const { identity, isNew } = await identities.allocate(labels);
 * assert.ok(isNew && identity.id >= 256 && identity.id <= 65535);
 * assert.equal(identities.lookup(labels)?.id, identity.id);
 * assert.equal(identities.lookupById(1)?.labels.toString(), "reserved:host");
 * assert.equal(await identities.release(identity), true); // this node's last use
 * ```
 *
 * @example Follow changes and another cluster's identities
 * ```ts
 * import assert from "node:assert/strict";
 * import { DenoKvBackend } from "@idalloc/idalloc";
 * import { IdentityAllocator, Labels } from "@idalloc/idalloc/identity";
 *
 * // Two clusters, each with its own store (here two in-memory Deno KV stores).
 * using kv1 = await Deno.openKv(":memory:");
 * using kv2 = await Deno.openKv(":memory:");
 * const prefix = ["identities"];
 * await using cluster2 = await IdentityAllocator.open(
 *   new DenoKvBackend(kv2, { prefix, node: "10.0.2.1" }),
 *   { clusterId: 2 },
 * );
 * // A remote cluster's identities must carry its name as their cluster label.
 * const db = Labels.parse(["k8s:app=db", "k8s:io.cilium.k8s.policy.cluster=cluster-2"]);
 * const { identity: remote } = await cluster2.allocate(db);
 *
 * await using identities = await IdentityAllocator.open(
 *   new DenoKvBackend(kv1, { prefix, node: "10.0.1.1" }),
 *   { clusterId: 1 },
 * );
 * const controller = new AbortController();
 * // The remote cluster's store, read only: its identities join this node's view.
 * await identities.watchRemote("cluster-2", new DenoKvBackend(kv2, { prefix, node: "10.0.1.1" }), {
 *   clusterId: 2,
 *   signal: controller.signal,
 * });
 * assert.ok(identities.lookupById(remote.id)?.labels.equals(db));
 * for await (const { added } of identities.changes({ signal: controller.signal })) {
 *   if (added.has(remote.id)) break; // the replay names it too
 * }
 * controller.abort();
 * ```
 *
 * @module
 */
export {
  type AllocateIdentityOptions,
  type AllocateIdentityResult,
  type ChangesOptions,
  IdentityAllocator,
  type IdentityAllocatorOptions,
  type ReleaseIdentityOptions,
  type RemoteClusterInfo,
  type WatchRemoteOptions,
} from "./allocator.ts";
export { LabelError } from "./errors.ts";
// Shared types this entrypoint's signatures use, re-exported so that it documents itself.
export type * from "../allocator/backend.ts";
export type {
  BackoffOptions,
  CacheValidator,
  CallOptions,
  GcRateLimit,
  GcStats,
  KeyCodec,
} from "../allocator/types.ts";
export { IdallocError, type IdallocErrorOptions } from "../errors.ts";
export {
  CLUSTER_LABEL_KEY,
  compareUtf8,
  FIXED_IDENTITY_LABEL_KEY,
  Label,
  type LabelParts,
  Labels,
  labelsCodec,
  LabelSource,
  splitLabel,
} from "./labels.ts";
export {
  allocationRange,
  clusterIdOf,
  clusterIdShift,
  hasLocalScope,
  hasRemoteNodeScope,
  IDENTITY_SCOPE_MASK,
  IdentityScope,
  isUserReservedIdentity,
  MAX_LOCAL_IDENTITY,
  MAX_NUMERIC_IDENTITY,
  type MaxConnectedClusters,
  MIN_LOCAL_IDENTITY,
  MINIMAL_NUMERIC_IDENTITY,
  ReservedIdentity,
  scopeOf,
  USER_RESERVED_NUMERIC_IDENTITY,
  WellKnownIdentity,
} from "./numeric.ts";
export {
  ReservedIdentities,
  type ReservedIdentitiesOptions,
  UNKNOWN_IDENTITY,
} from "./reserved.ts";
export { requiresGlobalIdentity, scopeForLabels } from "./scope.ts";
export type { Identity, IdentityChange } from "./types.ts";
export { allValidators, clusterIdValidator, clusterNameValidator } from "./validators.ts";
