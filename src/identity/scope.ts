/**
 * Which allocator a label set's identity comes from (Cilium's `ScopeForLabels`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { IdentityScope, Labels, scopeForLabels } from "@idalloc/idalloc/identity";
 *
 * assert.equal(scopeForLabels(Labels.parse(["cidr:10.0.0.0/8"])), IdentityScope.Local);
 * assert.equal(scopeForLabels(Labels.parse(["k8s:app=web"])), IdentityScope.Global);
 * ```
 *
 * @module
 */
import { Label, type Labels, LabelSource } from "./labels.ts";
import { IdentityScope } from "./numeric.ts";

const REMOTE_NODE = new Label(LabelSource.Reserved, "remote-node");

/** Sources whose label sets never need a cluster-wide identity. */
const LOCAL_SOURCES: ReadonlySet<string> = new Set([
  LabelSource.CIDR,
  LabelSource.FQDN,
  LabelSource.Reserved,
]);

/**
 * Cilium's `ScopeForLabels`: `reserved:remote-node` present → remote-node scope; otherwise local
 * scope iff every label's source is `cidr`, `fqdn` or `reserved`; otherwise (and for the empty
 * set) global. Reserved identities are matched before this (see `ReservedIdentities`).
 */
export function scopeForLabels(labels: Labels): number {
  if (labels.has(REMOTE_NODE)) return IdentityScope.RemoteNode;
  if (labels.size === 0) return IdentityScope.Global;
  for (const label of labels) {
    if (!LOCAL_SOURCES.has(label.source)) return IdentityScope.Global;
  }
  return IdentityScope.Local;
}

/** Whether the label set needs a global identity from the store (Cilium's `RequiresGlobalIdentity`). */
export function requiresGlobalIdentity(labels: Labels): boolean {
  return scopeForLabels(labels) === IdentityScope.Global;
}
