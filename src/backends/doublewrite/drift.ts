/**
 * Identities on each side of a double-write store, and those on one side only, as Cilium's
 * operator counts them in the double-write modes (`cilium_operator_identity_crd_total_count`,
 * `…_kvstore_total_count`, `…_crd_only_count`, `…_kvstore_only_count`), plus the IDs whose two
 * sides name different keys (drift no counter of Cilium's shows).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { countDrift } from "./drift.ts";
 * const kvstore = new Map([[256, "a"], [257, "b"]]);
 * const crd = new Map([[256, "a"], [258, "c"], [257, "x"]]);
 * assert.deepEqual(countDrift(kvstore, crd), {
 *   crd: { total: 3, only: 1 },
 *   kvstore: { total: 2, only: 0 },
 *   differing: [257],
 * });
 * ```
 *
 * @module
 */

/** One side's counts. */
export interface SideCount {
  /** Identities on this side (`…_total_count`). */
  readonly total: number;
  /** Identities whose ID this side has and the other does not (`…_only_count`). */
  readonly only: number;
}

/** What {@linkcode countDrift} finds. */
export interface DriftCount {
  /** The CRD side. */
  readonly crd: SideCount;
  /** The kvstore side. */
  readonly kvstore: SideCount;
  /** IDs both sides have, with different keys, ascending. */
  readonly differing: readonly number[];
}

/** Counts two sides' ID → key maps (see the module documentation). */
export function countDrift(
  kvstore: ReadonlyMap<number, string>,
  crd: ReadonlyMap<number, string>,
): DriftCount {
  let kvOnly = 0;
  const differing: number[] = [];
  for (const [id, key] of kvstore) {
    const other = crd.get(id);
    if (other === undefined) kvOnly++;
    else if (other !== key) differing.push(id);
  }
  let crdOnly = 0;
  for (const id of crd.keys()) if (!kvstore.has(id)) crdOnly++;
  return {
    crd: { total: crd.size, only: crdOnly },
    kvstore: { total: kvstore.size, only: kvOnly },
    differing: differing.sort((a, b) => a - b),
  };
}
