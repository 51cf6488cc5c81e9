/**
 * The store checks of a store of several sides (the double-write store: Cilium's kvstore and its
 * CRDs), once the run has settled:
 * - each side on its own passes the store checks (`./store.ts`): one live ID per key, one key per
 *   ID, one master per key where the side promises it, and every key a live worker holds has its
 *   master naming the worker's ID and the worker's live reference — on every side, so a held key
 *   is on both sides with the worker's ID;
 * - across the sides, the drift the store's harness classified (`StoreSnapshot.drift`) has none
 *   that breaks a promise when every writer is idalloc's: no ID with a different key on two sides,
 *   no key with a different ID on each. Identities on one side only are counted, not failed: a
 *   failed write's leftover, which the doctor copies or GC collects.
 *
 * Masters planted as garbage are left out, as the single-side checks leave them out.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkSides, SIDES_CHECK } from "./sides.ts";
 *
 * const side = (masters: { id: number; key: string }[]) => ({
 *   at: 0,
 *   masters,
 *   refs: [],
 *   strictMasters: false,
 *   skipped: {},
 * });
 * const result = checkSides(
 *   {
 *     ...side([]),
 *     sides: { kvstore: side([{ id: 7, key: "a" }]), crd: side([{ id: 7, key: "b" }]) },
 *     drift: [{ kind: "labels-differ", broken: true, ids: [7], message: "7 differs" }],
 *   },
 *   [],
 *   new Set(),
 * );
 * assert.deepEqual(result.violations.map((v) => v.check), [SIDES_CHECK]);
 * assert.deepEqual(result.drift, { "labels-differ": 1 });
 * ```
 *
 * @module
 */
import { isPlantedMaster, type StoreSnapshot } from "../../src/testing/nemesis.ts";
import { checkStore, type LiveHolds } from "./store.ts";
import type { Violation } from "./violation.ts";

/** Check name of the agreement across the sides. */
export const SIDES_CHECK = "every ID one key and every key one ID across the sides";

/** What {@linkcode checkSides} found. */
export interface SidesResult {
  /** Each side's store-check violations (named by the side), then the drift that breaks a promise. */
  readonly violations: Violation[];
  /** Drift found, by kind, breaking or not (planted garbage left out). */
  readonly drift: Record<string, number>;
}

/** Runs the store checks on each side of `snapshot` and checks its drift (see the module doc). */
export function checkSides(
  snapshot: StoreSnapshot,
  holders: readonly LiveHolds[],
  planted: ReadonlySet<number>,
): SidesResult {
  const violations: Violation[] = [];
  for (const [side, s] of Object.entries(snapshot.sides ?? {})) {
    const result = checkStore(
      { ...s, masters: s.masters.filter((m) => !isPlantedMaster(planted, m)) },
      holders,
    );
    for (const v of result.violations) {
      violations.push({
        ...v,
        message: `${side}: ${v.message}`,
        evidence: { side, ...v.evidence as Record<string, unknown> },
      });
    }
  }
  const drift: Record<string, number> = {};
  for (const d of snapshot.drift ?? []) {
    if (d.ids.some((id) => planted.has(id))) continue;
    drift[d.kind] = (drift[d.kind] ?? 0) + 1;
    if (!d.broken) continue;
    violations.push({
      check: SIDES_CHECK,
      message: d.message,
      evidence: { drift: d, sides: entriesOf(snapshot, d.ids) },
    });
  }
  return { violations, drift };
}

/** Every side's masters and references of `ids`: the evidence of a drift finding. */
function entriesOf(snapshot: StoreSnapshot, ids: readonly number[]): Record<string, unknown> {
  const wanted = new Set(ids);
  return Object.fromEntries(
    Object.entries(snapshot.sides ?? {}).map(([side, s]) => [side, {
      masters: s.masters.filter((m) => wanted.has(m.id)),
      refs: s.refs.filter((r) => wanted.has(r.id)),
    }]),
  );
}
