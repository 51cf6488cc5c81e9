/**
 * A key whose live references name different IDs (a split that Cilium's own writes make: its
 * `UpdateKey` re-creates a master and a reference without its mutex and without looking for the
 * key's other masters, and a Cilium node keeps answering from its local keys after its lease is
 * gone). idalloc cannot undo it — the references belong to Cilium nodes — so it converges on the
 * ID Cilium's own lookup gives the key: Cilium's `Allocator.Get` and `GetIfLocked` answer from
 * the watch cache first, whose `cache.OnUpsert` keeps the master it saw last, the newest (masters
 * are never rewritten, so their mod revision is their creation's). Among the IDs the references
 * name, that is the one whose master names the key and has the highest mod revision. When none
 * of them has a master naming the key there is nothing to converge on: {@linkcode SplitKeyError}.
 *
 * @example The newest master of the key wins; a master naming another key never does
 * ```ts
 * import assert from "node:assert/strict";
 * import { newestMaster } from "./split.ts";
 * const masters = new Map([
 *   [71, { value: "k;", mod: "900", corrupt: false }],
 *   [73, { value: "k;", mod: "120", corrupt: false }],
 *   [75, { value: "other;", mod: "950", corrupt: false }],
 * ]);
 * assert.deepEqual(newestMaster("k;", [71, 73, 75], masters), { id: 71, mod: "900" });
 * ```
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import type { MasterState, RefSnapshot } from "./txn.ts";

const log = idallocLogger("etcd", "split");

/** The distinct IDs that the key's well-formed references on a lease name, ascending. */
export function referencedIds(snapshot: RefSnapshot): number[] {
  const ids = new Set<number>();
  for (const ref of snapshot.exact) {
    if (ref.id !== undefined && ref.lease !== "0") ids.add(ref.id);
  }
  return [...ids].sort((a, b) => a - b);
}

/**
 * Of `ids`, the one whose master (in `masters`) names `key` with the highest mod revision;
 * `undefined` when none does. IDs missing from `masters` count as unknown: read them first.
 */
export function newestMaster(
  key: string,
  ids: readonly number[],
  masters: ReadonlyMap<number, MasterState>,
): { id: number; mod: string } | undefined {
  let best: { id: number; mod: string } | undefined;
  for (const id of ids) {
    const m = masters.get(id);
    if (!m || m.corrupt || m.value !== key) continue;
    if (!best || BigInt(m.mod) > BigInt(best.mod)) best = { id, mod: m.mod };
  }
  return best;
}

/** Logs, once per decision, that `key` is split and which ID idalloc takes. */
export function logSplit(key: string, ids: readonly number[], chosen: number): void {
  log.warning(
    "references of {key} name IDs {ids} (a split Cilium's writes made); using {chosen}, its " +
      "newest master, as Cilium's own lookup does",
    { key, ids, chosen },
  );
}
