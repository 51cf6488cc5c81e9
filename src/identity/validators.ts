/**
 * Cache validators for remote clusters (Cilium's `clusterIDValidator` and `clusterNameValidator`):
 * a remote cluster's identities are accepted only inside its own allocation range and only with
 * its own cluster-name label, with Cilium's exact error strings.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { clusterIdValidator } from "@idalloc/idalloc/identity";
 *
 * const validate = clusterIdValidator(5);
 * assert.equal(validate({ type: "upsert", id: 327680 }), undefined); // accepted
 * assert.match(validate({ type: "upsert", id: 1 }) ?? "", /ID 1 .*cluster ID 5/);
 * ```
 *
 * @module
 */
import type { CacheValidator } from "../allocator/types.ts";
import { CLUSTER_LABEL_KEY, LabelSource, splitLabel } from "./labels.ts";
import { allocationRange, type MaxConnectedClusters } from "./numeric.ts";

/** Rejects IDs outside the allocation range of cluster `clusterId` (upserts and deletes). */
export function clusterIdValidator(
  clusterId: number,
  maxConnectedClusters: MaxConnectedClusters = 255,
): CacheValidator {
  const { min, max } = allocationRange(clusterId, maxConnectedClusters);
  return ({ id }) =>
    id < min || id > max
      ? `ID ${id} does not belong to the allocation range of cluster ID ${clusterId}`
      : undefined;
}

/**
 * Requires upserts to carry `k8s:io.cilium.k8s.policy.cluster=<clusterName>`. Deletes always pass,
 * so that the cache can never keep an entry the remote has removed. The key is read as Cilium reads
 * a label array (in stored order, duplicates kept), so any cluster label with the wrong source or
 * name rejects the entry even if a correct one is present too.
 */
export function clusterNameValidator(clusterName: string): CacheValidator {
  return ({ type, key }) => {
    if (type !== "upsert") return undefined;
    if (key === undefined) return "unsupported key type <nil>";
    let found = false;
    for (const part of key.split(";")) {
      const label = splitLabel(part);
      if (label.key !== CLUSTER_LABEL_KEY) continue;
      if (label.source !== LabelSource.K8s) {
        return `unexpected source for cluster label: got ${label.source}, expected ${LabelSource.K8s}`;
      }
      if (label.value !== clusterName) {
        return `unexpected cluster name: got ${label.value}, expected ${clusterName}`;
      }
      found = true;
    }
    return found ? undefined : `could not find expected label ${CLUSTER_LABEL_KEY}`;
  };
}

/** Runs `validators` in order; the first rejection wins. */
export function allValidators(...validators: CacheValidator[]): CacheValidator {
  return (event) => {
    for (const validate of validators) {
      const reason = validate(event);
      if (reason !== undefined) return reason;
    }
    return undefined;
  };
}
