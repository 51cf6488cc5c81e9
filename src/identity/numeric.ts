/**
 * The numeric identity space (Cilium v1.16 `pkg/identity/numericidentity.go`): reserved and
 * well-known numbers, scopes (the top 8 bits) and the per-cluster allocation ranges.
 *
 * Bits of an identity: 0–15 the identity within its cluster, 16–23 the cluster ID (with 255
 * clusters; with 511 clusters 0–14 and 15–23), 24–31 the scope.
 *
 * @example The allocation range of a cluster
 * ```ts
 * import assert from "node:assert/strict";
 * import { allocationRange, clusterIdOf } from "@idalloc/idalloc/identity";
 *
 * assert.deepEqual(allocationRange(0), { min: 256, max: 65535 });
 * assert.deepEqual(allocationRange(5), { min: 327680, max: 393215 });
 * assert.equal(clusterIdOf(327681), 5);
 * ```
 *
 * @module
 */
import { InvalidOptionsError } from "../errors.ts";

/** Identity scopes: the top 8 bits of a numeric identity. */
export const IdentityScope = {
  /** Global (cluster-wide, from the store) and reserved identities. */
  Global: 0,
  /** Node-local identities of CIDR/FQDN/reserved-only label sets (`1 << 24`). */
  Local: 0x01000000,
  /** Node-local identities of remote nodes (`2 << 24`). */
  RemoteNode: 0x02000000,
} as const;

/** The bits of an identity that carry its scope. */
export const IDENTITY_SCOPE_MASK = 0xff000000;

/** The first identity not reserved by Cilium (the global range of cluster 0 starts here). */
export const MINIMAL_NUMERIC_IDENTITY = 256;

/** The first user-reserved identity (user-reserved: 128–255). */
export const USER_RESERVED_NUMERIC_IDENTITY = 128;

/** The largest numeric identity (identities are unsigned 32-bit integers). */
export const MAX_NUMERIC_IDENTITY = 0xffffffff;

/** Lowest value a node-local allocator hands out (before the scope is ORed in). */
export const MIN_LOCAL_IDENTITY = 1;

/** Highest value a node-local allocator hands out (before the scope is ORed in). */
export const MAX_LOCAL_IDENTITY = 0xffffff;

/** Cilium's reserved identities 0–10. */
export const ReservedIdentity = {
  /** No identity known (`reserved:unknown`). */
  Unknown: 0,
  /** The local host. */
  Host: 1,
  /** Anything outside the cluster. */
  World: 2,
  /** Endpoints not managed by Cilium. */
  Unmanaged: 3,
  /** The local cilium-health endpoint. */
  Health: 4,
  /** Endpoints that have no labels yet. */
  Init: 5,
  /** Every node of the cluster(s) but the local one. */
  RemoteNode: 6,
  /** Nodes that serve the kube-apiserver. */
  KubeAPIServer: 7,
  /** The source address of Ingress proxies. */
  Ingress: 8,
  /** The IPv4 world (dual-stack only). */
  WorldIPv4: 9,
  /** The IPv6 world (dual-stack only). */
  WorldIPv6: 10,
} as const;

/** Cilium's well-known identities 100–115 (the `…2` variants carry the namespace-name label). */
export const WellKnownIdentity = {
  /** The etcd-operator. */
  EtcdOperator: 100,
  /** The kvstore (etcd) managed by the etcd-operator. */
  CiliumKVStore: 101,
  /** kube-dns. */
  KubeDNS: 102,
  /** kube-dns on EKS. */
  EKSKubeDNS: 103,
  /** CoreDNS. */
  CoreDNS: 104,
  /** The Cilium operator. */
  CiliumOperator: 105,
  /** CoreDNS on EKS. */
  EKSCoreDNS: 106,
  /** The Cilium etcd-operator. */
  CiliumEtcdOperator: 107,
  /** {@linkcode WellKnownIdentity.EtcdOperator} with the namespace-name label. */
  EtcdOperator2: 108,
  /** {@linkcode WellKnownIdentity.CiliumKVStore} with the namespace-name label. */
  CiliumKVStore2: 109,
  /** {@linkcode WellKnownIdentity.KubeDNS} with the namespace-name label. */
  KubeDNS2: 110,
  /** {@linkcode WellKnownIdentity.EKSKubeDNS} with the namespace-name label. */
  EKSKubeDNS2: 111,
  /** {@linkcode WellKnownIdentity.CoreDNS} with the namespace-name label. */
  CoreDNS2: 112,
  /** {@linkcode WellKnownIdentity.CiliumOperator} with the namespace-name label. */
  CiliumOperator2: 113,
  /** {@linkcode WellKnownIdentity.EKSCoreDNS} with the namespace-name label. */
  EKSCoreDNS2: 114,
  /** {@linkcode WellKnownIdentity.CiliumEtcdOperator} with the namespace-name label. */
  CiliumEtcdOperator2: 115,
} as const;

/** How many clusters a mesh can hold: Cilium's `max-connected-clusters` (255 or 511). */
export type MaxConnectedClusters = 255 | 511;

/** The scope bits of `id` (`id & 0xFF000000`), as an unsigned number. */
export function scopeOf(id: number): number {
  return (id & IDENTITY_SCOPE_MASK) >>> 0;
}

/** Whether `id` is a node-local (CIDR/FQDN) identity. */
export function hasLocalScope(id: number): boolean {
  return scopeOf(id) === IdentityScope.Local;
}

/** Whether `id` is a remote-node-scoped identity. */
export function hasRemoteNodeScope(id: number): boolean {
  return scopeOf(id) === IdentityScope.RemoteNode;
}

/** Whether `id` lies in the user-reserved range 128–255. */
export function isUserReservedIdentity(id: number): boolean {
  return id >= USER_RESERVED_NUMERIC_IDENTITY && id < MINIMAL_NUMERIC_IDENTITY;
}

function checkMaxClusters(maxConnectedClusters: number): void {
  if (maxConnectedClusters !== 255 && maxConnectedClusters !== 511) {
    throw new InvalidOptionsError(
      `maxConnectedClusters must be 255 or 511, got ${maxConnectedClusters}`,
    );
  }
}

/**
 * Cilium's `GetClusterIDShift()`: `24 − log2(maxConnectedClusters + 1)`, i.e. 16 with 255
 * clusters and 15 with 511.
 */
export function clusterIdShift(maxConnectedClusters: MaxConnectedClusters = 255): number {
  checkMaxClusters(maxConnectedClusters);
  return maxConnectedClusters === 511 ? 15 : 16;
}

/** Throws {@linkcode InvalidOptionsError} unless `clusterId` is an integer in `[0, max]`. */
export function checkClusterId(
  clusterId: number,
  maxConnectedClusters: MaxConnectedClusters = 255,
): void {
  checkMaxClusters(maxConnectedClusters);
  if (!Number.isInteger(clusterId) || clusterId < 0 || clusterId > maxConnectedClusters) {
    throw new InvalidOptionsError(
      `cluster ID must be an integer in [0, ${maxConnectedClusters}], got ${clusterId}`,
    );
  }
}

/**
 * The global identities cluster `clusterId` allocates: `[256, 2^shift − 1]` for cluster 0 (0–255
 * are reserved), `[c << shift, ((c + 1) << shift) − 1]` otherwise (Cilium's
 * `GetMinimalAllocationIdentity` / `GetMaximumAllocationIdentity`).
 */
export function allocationRange(
  clusterId: number,
  maxConnectedClusters: MaxConnectedClusters = 255,
): { readonly min: number; readonly max: number } {
  checkClusterId(clusterId, maxConnectedClusters);
  const shift = clusterIdShift(maxConnectedClusters);
  const size = 2 ** shift;
  return {
    min: clusterId === 0 ? MINIMAL_NUMERIC_IDENTITY : clusterId * size,
    max: size * (clusterId + 1) - 1,
  };
}

/** Cilium's `NumericIdentity.ClusterID()`: `(id >> shift) & maxConnectedClusters`. */
export function clusterIdOf(id: number, maxConnectedClusters: MaxConnectedClusters = 255): number {
  const shift = clusterIdShift(maxConnectedClusters);
  return (id >>> shift) & maxConnectedClusters;
}
