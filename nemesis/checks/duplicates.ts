/**
 * What Cilium's CRD-mode nodes did with duplicates in a run (figures, not a check): Cilium's
 * agents create an identity without a lock, so two agents allocating one new key at once may
 * create two identities for it; every agent then picks the oldest (`creationTimestamp`), as
 * idalloc does. From the store's record and the answers:
 *
 * - **created**: identities created for a key that already had one (by who wrote them: the node
 *   whose reference came with the create or right after it; see `StoreHistory.writerOf`);
 * - **answered**: answers (allocate, get) that named a key's identity while the key had several,
 *   and how many of them named one that was not the oldest then — per side.
 *
 * @example No duplicate, nothing to count
 * ```ts
 * import assert from "node:assert/strict";
 * import { ciliumActivity } from "./duplicates.ts";
 * import { StoreHistory } from "./store_history.ts";
 * const a = ciliumActivity(new StoreHistory([]), [], new Set(), new Set());
 * assert.equal(a.created.total, 0);
 * ```
 *
 * @module
 */
import type { LogRecord } from "../records.ts";
import { prefers, type StoreHistory } from "./store_history.ts";

/** Answers of one side while a key had several identities. */
export interface DuplicateAnswers {
  /** Answers naming an identity of a key that had several at the time. */
  readonly whileDuplicated: number;
  /** Of those, answers naming one that was not the key's oldest. */
  readonly notOldest: number;
}

/** See the module doc. */
export interface CiliumActivity {
  readonly created: {
    readonly total: number;
    readonly byCilium: number;
    readonly byIdalloc: number;
    readonly unknown: number;
    /** Distinct keys that had two identities at once. */
    readonly keys: number;
  };
  readonly answered: { readonly cilium: DuplicateAnswers; readonly idalloc: DuplicateAnswers };
}

/** Counts the duplicates of `store` and the answers in `records` (see the module doc). */
export function ciliumActivity(
  store: StoreHistory,
  records: readonly LogRecord[],
  ciliumIncs: ReadonlySet<string>,
  ciliumNodes: ReadonlySet<string>,
): CiliumActivity {
  let total = 0, byCilium = 0, byIdalloc = 0, unknown = 0;
  const keys = new Set<string>();
  for (const m of store.allMasters()) {
    const others = store.mastersOfKeyDuring(m.key, m.from, m.from)
      .filter((o) => o.id !== m.id && o.fromRev < m.fromRev);
    if (others.length === 0) continue;
    total++;
    keys.add(m.key);
    const writer = store.writerOf(m);
    if (!writer) unknown++;
    else if (ciliumNodes.has(writer.node)) byCilium++;
    else byIdalloc++;
  }
  const cilium = { whileDuplicated: 0, notOldest: 0 };
  const idalloc = { whileDuplicated: 0, notOldest: 0 };
  for (const r of records) {
    if (r.t !== "call" || !r.ok || r.id === undefined || r.op === "release") continue;
    const live = store.mastersOfKeyDuring(r.key, r.end, r.end);
    if (live.length < 2 || !live.some((m) => m.id === r.id)) continue;
    const side = ciliumIncs.has(r.inc) ? cilium : idalloc;
    side.whileDuplicated++;
    // Cilium's answer and idalloc's: the oldest creationTimestamp, ties to the lowest ID.
    const oldest = live.reduce((a, b) => (prefers(b, a, "oldest") ? b : a));
    if (oldest.id !== r.id) side.notOldest++;
  }
  return {
    created: { total, byCilium, byIdalloc, unknown, keys: keys.size },
    answered: { cilium, idalloc },
  };
}
