/**
 * The store's own history of a run: every change of a master or a reference, in the store's order
 * (its revision), with the instant the recorder saw it. A store that can tell (etcd: a watch of the
 * prefix from the start of the run) records it as JSON lines ({@linkcode storeChangeSchema}); the
 * attribution of violations (`attribution.ts`) reads it back through {@linkcode StoreHistory}, to
 * say which write made a conflicting master and what the store showed when a node answered.
 *
 * Spans are half-open in revisions: a master or reference exists from the revision that wrote it
 * until the one that deleted or replaced it. Times are the recorder's, so they lag the store's
 * commit by the watch's delay — by seconds while a member is down, as the resumed watch replays
 * what it missed in one batch: a change may have happened as early as the last arrival, before
 * its own batch, of a change with a lower revision (`fromEarly`, `toEarly`; the recorder stamps a
 * batch at once). A record merged from several watches (Kubernetes) is in revision order per
 * watch only, and what a re-list brings after a gap may be as old as the gap: see
 * `earliestInstants`.
 *
 * @example A master created with a reference in one transaction is that node's write
 * ```ts
 * import assert from "node:assert/strict";
 * import { StoreHistory } from "./store_history.ts";
 * const h = new StoreHistory([
 *   { t: "master", rev: 5, at: 1_000, id: 7, key: "k;" },
 *   { t: "ref", rev: 5, at: 1_000, key: "k;", node: "w0", id: 7, lease: "1a" },
 * ]);
 * assert.equal(h.masterAt(7, 1_500)?.key, "k;");
 * assert.deepEqual(h.writerOf(h.masterAt(7, 1_500)!), { node: "w0", how: "same transaction" });
 * ```
 *
 * @module
 */
import type { StoreChange } from "../../src/testing/store_changes.ts";

export { type StoreChange, storeChangeSchema } from "../../src/testing/store_changes.ts";

/** When a span began and ended: as recorded (the latest it can have been), and the earliest. */
export interface Timed {
  readonly fromRev: number;
  /** When the recorder saw it written. */
  readonly from: number;
  /** The earliest it can have been written (earlier than `from` only in an uncertain window). */
  readonly fromEarly: number;
  /** Deletion; absent while it still existed at the end of the record. */
  toRev?: number;
  to?: number;
  toEarly?: number;
}

/** A master's life: from the change that wrote it to the one that deleted it. */
export interface MasterSpan extends Timed {
  readonly id: number;
  readonly key: string;
  /** Kubernetes: its `creationTimestamp` (ms, whole seconds), when the record has it. */
  readonly created?: number;
}

/**
 * Which of a key's masters Cilium's own lookup gives: the **newest** (kvstore mode:
 * `cache.OnUpsert` keeps the last one seen) or the **oldest** (CRD mode: `crdBackend.get` sorts
 * the key's identities by `creationTimestamp`).
 */
export type KeyLookup = "newest" | "oldest";

/**
 * Whether the lookup prefers master `a` to master `b` of one key. Newest: the later revision.
 * Oldest: the older `creationTimestamp`, not the earlier revision — the API server stamps a create
 * when it admits it, so while etcd is down a create admitted first can commit second (seed 2 of
 * the first mixed runs: both identities of `k8s:app=k66;` committed within 111 ms, 4 s after
 * Cilium's create was admitted). Equal timestamps (one-second resolution) go to the lower ID under
 * idalloc's rule (`answerOf`); Cilium's `sort.Slice` is not stable, so with `ties: "either"` (a
 * Cilium answer) an exact tie prefers neither. Without timestamps (etcd, older records), the
 * revision order stands in.
 */
export function prefers(
  a: MasterSpan,
  b: MasterSpan,
  lookup: KeyLookup,
  ties: "lowest-id" | "either" = "lowest-id",
): boolean {
  if (lookup === "newest") return a.fromRev > b.fromRev;
  if (a.created === undefined || b.created === undefined) return a.fromRev < b.fromRev;
  if (a.created !== b.created) return a.created < b.created;
  return ties === "lowest-id" && a.id < b.id;
}

/** A reference's life (one value on one lease). */
export interface RefSpan extends Timed {
  readonly key: string;
  readonly node: string;
  readonly id: number;
  readonly lease: string;
}

/** A Cilium mutex held by one lease. */
export interface LockSpan {
  readonly of: string;
  readonly lease: string;
  readonly from: number;
  to?: number;
}

/** Who wrote a master, and how that was told. */
export interface Writer {
  readonly node: string;
  /**
   * `same transaction`: the node's reference to it was written in the master's revision (an
   * idalloc write); `next reference`: the first reference to it written after the master, within
   * a second (Cilium writes the master, then its reference, under its mutex).
   */
  readonly how: "same transaction" | "next reference";
}

/** How long after a master its writer's own reference may follow (Cilium's second step). */
const NEXT_REFERENCE_MS = 1_000;

function live(span: { from: number; to?: number }, at: number): boolean {
  return span.from <= at && (span.to === undefined || at < span.to);
}

/** Spans of the recorded changes, and the questions the attribution asks of them. */
export class StoreHistory {
  readonly #masters = new Map<number, MasterSpan[]>();
  readonly #mastersOfKey = new Map<string, MasterSpan[]>();
  readonly #refs = new Map<string, RefSpan[]>();
  readonly #refsOfId = new Map<string, RefSpan[]>();
  readonly #refsById = new Map<number, RefSpan[]>();
  readonly #locks = new Map<string, LockSpan[]>();
  /** Gaps of the record (lost events): blind from `since` (when given) until its re-list at `at`. */
  readonly gaps: readonly { readonly at: number; readonly why: string; readonly since?: number }[];
  /** Number of changes recorded. */
  readonly size: number;

  /**
   * Whether the record was blind at `t`: a watch had lost its stream (from the last instant it was
   * current to its re-list), so what was written and undone meanwhile is missing from it.
   */
  blindAt(t: number): boolean {
    return this.gaps.some((g) => g.since !== undefined && g.since <= t && t <= g.at);
  }

  /** Builds the spans of `changes` (any order: sorted by revision here). */
  constructor(changes: readonly StoreChange[]) {
    const gaps: { at: number; why: string; since?: number }[] = [];
    // Lease and deletion records judge deletions (`deletions.ts`), not spans.
    const sorted = changes.filter((c) =>
      c.t !== "lease" && c.t !== "deleted" && (c.t !== "gap" || (gaps.push(c), false))
    ) as Exclude<StoreChange, { t: "gap" | "lease" | "deleted" }>[];
    sorted.sort((a, b) => a.rev - b.rev);
    this.gaps = gaps;
    this.size = sorted.length;
    const openMaster = new Map<number, MasterSpan>();
    const openRef = new Map<string, RefSpan>();
    const openLock = new Map<string, LockSpan>();
    const earliest = earliestInstants(sorted, gaps);
    for (const [i, c] of sorted.entries()) {
      const early = earliest[i];
      if (c.t === "lock") {
        const name = `${c.of}\u0000${c.lease}`;
        const open = openLock.get(name);
        if (c.held && !open) {
          const span: LockSpan = { of: c.of, lease: c.lease, from: c.at };
          openLock.set(name, span);
          push(this.#locks, c.of, span);
        } else if (!c.held && open) {
          open.to = c.at;
          openLock.delete(name);
        }
        continue;
      }
      if (c.t === "master") {
        const open = openMaster.get(c.id);
        if (open) {
          open.toRev = c.rev;
          open.to = c.at;
          open.toEarly = early;
          openMaster.delete(c.id);
        }
        if (c.key === null) continue;
        const span: MasterSpan = {
          id: c.id,
          key: c.key,
          fromRev: c.rev,
          from: c.at,
          fromEarly: early,
          ...(c.created === undefined ? {} : { created: c.created }),
        };
        openMaster.set(c.id, span);
        push(this.#masters, c.id, span);
        push(this.#mastersOfKey, c.key, span);
        continue;
      }
      const ref = `${c.key}\u0000${c.node}`;
      const open = openRef.get(ref);
      if (open) {
        open.toRev = c.rev;
        open.to = c.at;
        open.toEarly = early;
        openRef.delete(ref);
      }
      if (c.id === null) continue;
      const span: RefSpan = {
        key: c.key,
        node: c.node,
        id: c.id,
        lease: c.lease ?? "0",
        fromRev: c.rev,
        from: c.at,
        fromEarly: early,
      };
      openRef.set(ref, span);
      push(this.#refs, c.key, span);
      push(this.#refsOfId, `${c.key}\u0000${c.id}`, span);
      push(this.#refsById, c.id, span);
    }
  }

  /** The Cilium mutexes of `of` (a key, or `id/<N>`) held at some instant of `[from, to]`. */
  locksDuring(of: string, from: number, to: number): LockSpan[] {
    return (this.#locks.get(of) ?? []).filter((s) => overlaps(s, from, to));
  }

  /** Every master span, in the order they were written. */
  allMasters(): MasterSpan[] {
    return [...this.#masters.values()].flat().sort((a, b) => a.fromRev - b.fromRev);
  }

  /** The master of `id` at instant `at`, if one existed. */
  masterAt(id: number, at: number): MasterSpan | undefined {
    return this.#masters.get(id)?.find((s) => live(s, at));
  }

  /** Every master span of `id` that existed at some instant of `[from, to]`. */
  mastersOfIdDuring(id: number, from: number, to: number): MasterSpan[] {
    return (this.#masters.get(id) ?? []).filter((s) => overlaps(s, from, to));
  }

  /** Every master span naming `key` that existed at some instant of `[from, to]`. */
  mastersOfKeyDuring(key: string, from: number, to: number): MasterSpan[] {
    return (this.#mastersOfKey.get(key) ?? []).filter((s) => overlaps(s, from, to));
  }

  /** The references of `key` at instant `at`. */
  refsAt(key: string, at: number): RefSpan[] {
    return (this.#refs.get(key) ?? []).filter((s) => live(s, at));
  }

  /** Every reference span of `key` by `node`. */
  refsOf(key: string, node: string): RefSpan[] {
    return (this.#refs.get(key) ?? []).filter((s) => s.node === node);
  }

  /** Every reference span of `key` naming `id` that existed at some instant of `[from, to]`. */
  refsToDuring(key: string, id: number, from: number, to: number): RefSpan[] {
    return (this.#refsOfId.get(`${key}\u0000${id}`) ?? []).filter((s) => overlaps(s, from, to));
  }

  /**
   * The live references (on a lease) that contradicted `master` when it was written: of its key,
   * naming another ID, or of another key, naming its ID. A write that lands on such a store gives
   * a key a second live ID or an ID a second key.
   */
  contradictedAtWrite(master: MasterSpan): RefSpan[] {
    const liveAt = (r: RefSpan) =>
      r.lease !== "0" && r.fromRev < master.fromRev &&
      (r.toRev === undefined || r.toRev > master.fromRev);
    return [
      ...(this.#refs.get(master.key) ?? []).filter((r) => r.id !== master.id && liveAt(r)),
      ...(this.#refsById.get(master.id) ?? []).filter((r) => r.key !== master.key && liveAt(r)),
    ];
  }

  /**
   * Who wrote `master`: the node whose reference to it was written in the same revision, else the
   * first node to reference it within a second after it, else unknown.
   */
  writerOf(master: MasterSpan): Writer | undefined {
    const refs = this.#refsOfId.get(`${master.key}\u0000${master.id}`) ?? [];
    const same = refs.find((r) => r.fromRev === master.fromRev);
    if (same) return { node: same.node, how: "same transaction" };
    const next = refs
      .filter((r) => r.fromRev > master.fromRev && r.from - master.from <= NEXT_REFERENCE_MS)
      .sort((a, b) => a.fromRev - b.fromRev)[0];
    return next ? { node: next.node, how: "next reference" } : undefined;
  }
}

/**
 * How long after a gap record a change may still come from the re-list that follows it (the
 * Kubernetes recorder waits 300 ms, then lists; a list takes seconds on a loaded machine).
 */
export const RELIST_MS = 5_000;

/**
 * The earliest instant each change of `sorted` (in revision order) can have happened: the last
 * arrival, before its own, of a change with a lower revision — the record was current up to then
 * and had not seen it — or its own arrival when none came before. Not the arrival of the change
 * just before it in revision order: the record merges several watches (Kubernetes: identities,
 * reference objects, endpoints, node Leases), each in its own order and with its own delay, so a
 * lower revision can arrive seconds after a higher one (seed 7 of the mixed Kubernetes runs: an
 * endpoint of revision 2651 recorded 8 s after w1's reference of revision 2653, which then read
 * as written 8 s after it was seen, and w1 as answering with no reference). A change's `early`,
 * where the recorder wrote one (Kubernetes: its own watch's previous batch, or after a failure
 * the instant that watch was last current), stands instead. Records without it: what arrives
 * within {@linkcode RELIST_MS} after a gap record without `since` may come from a re-list, as
 * late as the watch was blind: the last arrival before the gaps began (seed 7: w0's reference of
 * `k8s:app=k137;`, written before its answer at 09:24:53.996, re-listed at 54.245 after a 410).
 */
function earliestInstants(
  sorted: readonly { rev: number; at: number; early?: number }[],
  gaps: readonly { at: number; since?: number }[],
): number[] {
  // Ranks of the distinct revisions, and a max-tree over them of the arrivals seen so far.
  const revs = [...new Set(sorted.map((c) => c.rev))];
  const rank = new Map(revs.map((r, i) => [r, i]));
  const tree = new Array<number>(revs.length + 1).fill(-Infinity);
  const add = (i: number, at: number) => {
    for (let j = i + 1; j <= revs.length; j += j & -j) tree[j] = Math.max(tree[j], at);
  };
  /** The latest arrival among ranks below `i`. */
  const below = (i: number) => {
    let best = -Infinity;
    for (let j = i; j > 0; j -= j & -j) best = Math.max(best, tree[j]);
    return best;
  };
  const out = new Array<number>(sorted.length);
  const byArrival = sorted.map((_, i) => i).sort((a, b) => sorted[a].at - sorted[b].at);
  for (let k = 0; k < byArrival.length;) {
    // One arrival instant at a time: a change's own batch does not bound it.
    let end = k;
    while (end < byArrival.length && sorted[byArrival[end]].at === sorted[byArrival[k]].at) end++;
    for (let m = k; m < end; m++) {
      const i = byArrival[m];
      const c = sorted[i];
      const seen = below(rank.get(c.rev)!);
      // The recorder's own bound, from the change's watch alone, where it wrote one.
      out[i] = Math.min(c.at, c.early ?? (seen === -Infinity ? c.at : seen));
    }
    for (let m = k; m < end; m++) add(rank.get(sorted[byArrival[m]].rev)!, sorted[byArrival[m]].at);
    k = end;
  }
  // Records that do not mark re-listed changes: after a gap, the last arrival before it began.
  const unmarked = gaps.filter((g) => g.since === undefined).sort((a, b) => a.at - b.at);
  if (unmarked.length === 0) return out;
  const arrivals = sorted.map((c) => c.at).sort((a, b) => a - b);
  /** Per unmarked gap: where its run of gaps (each within RELIST_MS of the last) began. */
  const blindFrom: { at: number; from: number }[] = [];
  for (const g of unmarked) {
    const prev = blindFrom.at(-1);
    const first = prev && g.at - prev.at <= RELIST_MS ? prev.from : lastBefore(arrivals, g.at);
    blindFrom.push({ at: g.at, from: first });
  }
  for (const [i, c] of sorted.entries()) {
    if (c.early !== undefined) continue;
    const g = blindFrom[upTo(blindFrom, c.at) - 1];
    if (g && c.at - g.at <= RELIST_MS) out[i] = Math.min(out[i], g.from);
  }
  return out;
}

/** The last of the sorted `arrivals` before `at` (`at` itself when none). */
function lastBefore(arrivals: readonly number[], at: number): number {
  let lo = 0;
  let hi = arrivals.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (arrivals[mid] < at) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 ? arrivals[lo - 1] : at;
}

/** How many of `list` (sorted by `at`) are at or before `at`. */
function upTo(list: readonly { at: number }[], at: number): number {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid].at <= at) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

function overlaps(span: { from: number; to?: number }, from: number, to: number): boolean {
  return span.from <= to && (span.to === undefined || span.to > from);
}

function push<K, V>(map: Map<K, V[]>, key: K, value: V): void {
  let list = map.get(key);
  if (!list) map.set(key, list = []);
  list.push(value);
}
