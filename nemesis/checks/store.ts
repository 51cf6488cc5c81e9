/**
 * Checks of a store snapshot taken once the run has settled (workers stopped calling, faults over,
 * a sync period passed), against what the live workers say they hold:
 * - one live ID per key: the live references of a key all name one ID;
 * - one key per ID: a live reference's ID has a master, and that master names the reference's key;
 * - one master per key: on Deno KV strictly (the key index is the single source of key → ID, and
 *   the index and master are written and deleted together); on etcd a stale unreferenced
 *   duplicate is allowed (GC collects it) and only counted;
 * - every key a live worker holds has its master, naming the worker's ID, and a live reference of
 *   the worker naming that ID.
 *
 * The snapshot holds only entries that parse (garbage is skipped by the reader, as the backends
 * skip it), so planted garbage never counts as data here.
 *
 * @module
 */
import type { StoreSnapshot } from "../../src/testing/nemesis.ts";
import { capViolations, short, type Violation } from "./violation.ts";

/** What one live worker holds once it stopped calling. */
export interface LiveHolds {
  readonly node: string;
  readonly inc: string;
  readonly holds: Readonly<Record<string, number>>;
}

/** Check names. */
export const STORE_CHECKS = {
  oneLiveId: "one live ID per key",
  oneKey: "one key per ID",
  oneMaster: "one master per key",
  holds: "every held key has its master and reference",
} as const;

/** What {@linkcode checkStore} found. */
export interface StoreCheckResult {
  readonly violations: Violation[];
  /** Keys with a stale duplicate master (etcd; allowed until GC collects it). */
  readonly staleDuplicates: number;
  readonly dropped: Record<string, number>;
}

/** Runs the store checks (see the module doc). */
export function checkStore(
  snapshot: StoreSnapshot,
  holders: readonly LiveHolds[],
  limit = 25,
): StoreCheckResult {
  const masterOf = new Map<number, string>();
  const mastersOfKey = new Map<string, number[]>();
  for (const m of snapshot.masters) {
    masterOf.set(m.id, m.key);
    const list = mastersOfKey.get(m.key) ?? [];
    list.push(m.id);
    mastersOfKey.set(m.key, list);
  }
  const liveIds = new Map<string, Set<number>>();
  const liveRef = new Map<string, number>();
  const oneLiveId: Violation[] = [];
  const oneKey: Violation[] = [];
  for (const r of snapshot.refs) {
    if (!r.live) continue;
    liveRef.set(`${r.key}\u0000${r.node}`, r.id);
    let ids = liveIds.get(r.key);
    if (!ids) liveIds.set(r.key, ids = new Set());
    ids.add(r.id);
    const master = masterOf.get(r.id);
    if (master !== r.key) {
      oneKey.push({
        check: STORE_CHECKS.oneKey,
        message: master === undefined
          ? `live reference ${r.key}@${r.node} names ID ${r.id}, which has no master`
          : `live reference ${r.key}@${r.node} names ID ${r.id}, whose master is ${short(master)}`,
        evidence: { reference: r, master: master ?? null },
      });
    }
  }
  for (const [key, ids] of liveIds) {
    if (ids.size > 1) {
      oneLiveId.push({
        check: STORE_CHECKS.oneLiveId,
        message: `key ${key} has live references to IDs ${
          [...ids].sort((a, b) => a - b).join(", ")
        }`,
        evidence: { key, refs: snapshot.refs.filter((r) => r.key === key) },
      });
    }
  }
  const oneMaster: Violation[] = [];
  let staleDuplicates = 0;
  for (const [key, ids] of mastersOfKey) {
    if (ids.length < 2) continue;
    if (!snapshot.strictMasters) {
      staleDuplicates++;
      continue;
    }
    oneMaster.push({
      check: STORE_CHECKS.oneMaster,
      message: `key ${short(key)} has masters ${ids.sort((a, b) => a - b).join(", ")}`,
      evidence: { key, ids, refs: snapshot.refs.filter((r) => r.key === key) },
    });
  }
  if (snapshot.index) {
    const indexed = new Map<string, number>();
    for (const { key, id } of snapshot.index) {
      indexed.set(key, id);
      if (masterOf.get(id) !== key) {
        oneMaster.push({
          check: STORE_CHECKS.oneMaster,
          message: `key index ${key} → ${id}, but master ${id} is ${
            short(masterOf.get(id) ?? "absent")
          }`,
          evidence: { key, id, master: masterOf.get(id) ?? null },
        });
      }
    }
    for (const m of snapshot.masters) {
      if (indexed.get(m.key) !== m.id) {
        oneMaster.push({
          check: STORE_CHECKS.oneMaster,
          message: `master ${m.id} → ${short(m.key)} is not its key's index entry (index: ${
            indexed.get(m.key) ?? "absent"
          })`,
          evidence: { master: m, index: indexed.get(m.key) ?? null },
        });
      }
    }
  }
  const holds: Violation[] = [];
  for (const h of holders) {
    for (const [key, id] of Object.entries(h.holds)) {
      const master = masterOf.get(id);
      const ref = liveRef.get(`${key}\u0000${h.node}`);
      if (master === key && ref === id) continue;
      holds.push({
        check: STORE_CHECKS.holds,
        message: `${h.node} (${h.inc}) holds ${key} → ${id}; master ${id} is ${
          short(master ?? "absent")
        }, its live reference names ${ref ?? "nothing"}`,
        evidence: {
          holder: h.node,
          inc: h.inc,
          key,
          id,
          master: master ?? null,
          mastersOfKey: mastersOfKey.get(key) ?? [],
          refs: snapshot.refs.filter((r) => r.key === key),
        },
      });
    }
  }
  const dropped: Record<string, number> = {};
  return {
    violations: [
      ...capViolations(oneLiveId, limit, dropped),
      ...capViolations(oneKey, limit, dropped),
      ...capViolations(oneMaster, limit, dropped),
      ...capViolations(holds, limit, dropped),
    ],
    staleDuplicates,
    dropped,
  };
}
