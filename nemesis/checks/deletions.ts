/**
 * The check a run beside Cilium CRD-mode nodes adds (`--cilium N` on Kubernetes): **no identity
 * that an idalloc node holds, or that a `CiliumEndpoint` names, is ever deleted** — by idalloc's GC
 * or by Cilium's operator rule. Two collectors share one store there, and either may delete what
 * the other's users still need.
 *
 * Every deletion comes from the store's record (`deleted`: the identity's last state, with its
 * idalloc references `node → epoch`), and is judged against the record at the deletion's
 * revision (resource versions are etcd revisions, one order for identities, endpoints and Leases):
 *
 * - **held**: a reference on it whose node's Lease had that epoch and had certainly not expired
 *   when the deletion was seen (`expiresAt - skew` after the recorder's instant, which is no
 *   earlier than the deletion itself), **and** that was no join still under way: the reference
 *   was in the record before the deleting GC pass started (so the pass read it: it lists the
 *   identities, then the reference objects, then the Leases), or its node had answered the
 *   identity for the key before the deletion (its calls, heartbeats and `reassigned` events,
 *   `records`: the last one of the key before the deletion named that ID, with no last-use release
 *   after it), or might have (an allocate under way at the deletion answered that ID without
 *   creating it). A joiner writes its reference **before** it looks at the identity (`refs.ts`),
 *   so a reference can appear during the pass that deletes the identity: the joiner then finds the
 *   mark and removes it, and either its unmark refuses the delete, or it finds the identity gone
 *   and re-creates it from its claim (answering it as new) or moves to another identity of the
 *   key, and only then answers (`refs.ts`, case 2). Such a deletion is **raced** (reported, not
 *   failed): no caller was ever given the deleted identity. A joiner that answered it without
 *   removing the mark (`refs.ts`, case 3) held it, and fails the check. Cilium's operator reads no
 *   idalloc reference at all: what it must never delete is what idalloc nodes answered (they keep
 *   the mark off it), so for its deletions a reference counts only with such an answer. Without
 *   `records`, every live reference counts;
 * - **endpoint-named**: a `CiliumEndpoint` (an endpoint reference in the record) named its ID.
 *
 * Who deleted it: idalloc's GC when a pass of the GC loop (`gc.jsonl`) listed the ID among its
 * deletions around that instant, else Cilium's operator. The class follows: idalloc's GC deleting
 * either kind is idalloc's fault (**idalloc-only**); the operator deleting an identity an idalloc
 * node held is too (**mixed (idalloc's)**: idalloc keeps the operator's mark off what it holds);
 * the operator deleting one only an endpoint named is Cilium's own rule (**Cilium-only**). A
 * deletion inferred across a gap of the record (not seen as its own event) is listed as uncertain
 * and fails nothing: its last state may predate the deletion.
 *
 * @example An operator deletion of an identity an endpoint names is flagged
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkDeletions } from "./deletions.ts";
 * const { violations } = checkDeletions({
 *   changes: [
 *     { t: "ref", rev: 5, at: 1_000, key: "k8s:app=k1;", node: "c0", id: 300, lease: "cep" },
 *     { t: "deleted", rev: 9, at: 2_000, id: 300, key: "k8s:app=k1;", refs: {}, marked: true },
 *   ],
 *   gcPasses: [],
 *   skewMs: 500,
 * });
 * assert.equal(violations.length, 1);
 * assert.equal((violations[0].evidence as { class: string }).class, "Cilium-only");
 * ```
 *
 * @module
 */
import { isPlantedMaster } from "../../src/testing/nemesis.ts";
import type { StoreChange } from "../../src/testing/store_changes.ts";
import type { LogRecord } from "../records.ts";
import type { AttributionClass } from "./attribution.ts";
import { clock, type Violation } from "./violation.ts";

/** The check's name. */
export const DELETION_CHECK = "no held or endpoint-named identity is deleted";

/** The lease name endpoint references carry in the record. */
const ENDPOINT_LEASE = "cep";

/** How long after a GC pass's end its deletion may be seen by the recorder. */
const RECORDER_LAG_MS = 5_000;

/** One pass of idalloc's GC loop, as `gc.jsonl` logs it. */
export interface GcPass {
  readonly start: number;
  readonly end: number;
  readonly deleted?: readonly number[];
}

/** What {@linkcode checkDeletions} reads. */
export interface DeletionInput {
  /** The store's record (any order). */
  readonly changes: readonly StoreChange[];
  /** idalloc's GC passes. */
  readonly gcPasses: readonly GcPass[];
  /** The clock-skew margin Leases are judged with. */
  readonly skewMs: number;
  /** IDs planted as garbage (their deletion is GC's job). */
  readonly planted?: ReadonlySet<number>;
  /**
   * The idalloc nodes' logs (calls, heartbeats, `reassigned` events): what each node answered, to
   * tell a hold from a join under way (module doc). Absent: every live reference is a hold.
   */
  readonly records?: readonly LogRecord[];
}

/** One deletion, judged. */
export interface JudgedDeletion {
  readonly id: number;
  readonly key: string;
  readonly rev: number;
  readonly at: number;
  /** idalloc nodes whose live reference it carried, as a hold (module doc). */
  readonly heldBy: readonly string[];
  /**
   * idalloc nodes whose live reference it carried as a join under way: written after the
   * deleting pass started (or, for the operator, at any time) by a node that had not answered it.
   */
  readonly joinedBy: readonly string[];
  /** Cilium nodes whose endpoint named it. */
  readonly namedBy: readonly string[];
  readonly deleter: "idalloc GC" | "Cilium operator";
  readonly inferred: boolean;
}

/** What {@linkcode checkDeletions} found. */
export interface DeletionResult {
  /** Every deletion recorded. */
  readonly deletions: number;
  /** By deleter. */
  readonly byDeleter: Readonly<Record<JudgedDeletion["deleter"], number>>;
  /** Certain deletions of a held or endpoint-named identity, classed in `evidence.class`. */
  readonly violations: Violation[];
  /** Deletions inferred across a gap that would have counted: reported, not failed. */
  readonly uncertain: readonly JudgedDeletion[];
  /**
   * Deletions that raced a join (`refs.ts`, case 2): live references only of joins under way,
   * none held, no endpoint. Reported, not failed: nobody was given the deleted identity.
   */
  readonly raced: readonly JudgedDeletion[];
}

/** One record of a node's reference of a key (`ref`, idalloc's: not an endpoint's). */
interface PairRef {
  readonly rev: number;
  readonly at: number;
  readonly id: number | null;
  readonly lease?: string;
}

/** See the module doc. */
export function checkDeletions(input: DeletionInput): DeletionResult {
  const sorted = [...input.changes].filter((c) => c.t !== "gap")
    .sort((a, b) => (a as { rev: number }).rev - (b as { rev: number }).rev) as Exclude<
      StoreChange,
      { t: "gap" }
    >[];
  const leases = new Map<string, { epoch: string | null; expiresAt: number | null }>();
  /** Endpoint references: `key\0node` → ID. */
  const endpoints = new Map<string, { node: string; id: number }>();
  /** Every record of an idalloc node's reference of a key, `key\0node` → in revision order. */
  const pairs = new Map<string, PairRef[]>();
  const holds = input.records === undefined ? undefined : new Holds(input.records);
  const byDeleter = { "idalloc GC": 0, "Cilium operator": 0 };
  const violations: Violation[] = [];
  const uncertain: JudgedDeletion[] = [];
  const raced: JudgedDeletion[] = [];
  let deletions = 0;
  for (const c of sorted) {
    if (c.t === "lease") {
      leases.set(c.node, { epoch: c.epoch, expiresAt: c.expiresAt });
    } else if (c.t === "ref" && (c.lease === ENDPOINT_LEASE || c.id === null)) {
      const name = `${c.key}\u0000${c.node}`;
      if (c.id === null) endpoints.delete(name);
      else endpoints.set(name, { node: c.node, id: c.id });
    }
    if (c.t === "ref" && c.lease !== ENDPOINT_LEASE) {
      const name = `${c.key}\u0000${c.node}`;
      const list = pairs.get(name) ?? [];
      list.push({
        rev: c.rev,
        at: c.at,
        id: c.id,
        ...(c.lease === undefined ? {} : { lease: c.lease }),
      });
      pairs.set(name, list);
    } else if (c.t === "deleted") {
      if (input.planted !== undefined && isPlantedMaster(input.planted, c)) continue;
      deletions++;
      const live = Object.entries(c.refs).filter(([node, epoch]) => {
        const lease = leases.get(node);
        return lease?.epoch === epoch && lease.expiresAt !== null &&
          lease.expiresAt - input.skewMs > c.at;
      });
      const pass = passOf(c.id, c.at, input.gcPasses);
      const deleter = pass === undefined ? "Cilium operator" : "idalloc GC";
      const heldBy: string[] = [];
      const joinedBy: string[] = [];
      for (const [node, epoch] of live) {
        const answered = holds === undefined || holds.heldAt(node, c.key, c.id, c.at);
        // When the record last showed this reference appear (its node's reference of the key
        // naming this ID under this epoch), before the deletion's own revision: unknown (another
        // identity of the key recorded for the pair since) counts as old.
        const since = refSince(pairs.get(`${c.key}\u0000${node}`), c.id, epoch, c.rev);
        const readByPass = pass !== undefined && (since === undefined || since < pass.start);
        (answered || readByPass ? heldBy : joinedBy).push(node);
      }
      const namedBy = [...endpoints.values()].filter((e) => e.id === c.id).map((e) => e.node);
      byDeleter[deleter]++;
      const judged: JudgedDeletion = {
        id: c.id,
        key: c.key,
        rev: c.rev,
        at: c.at,
        heldBy,
        joinedBy,
        namedBy,
        deleter,
        inferred: c.inferred ?? false,
      };
      if (heldBy.length === 0 && namedBy.length === 0) {
        if (joinedBy.length > 0 && !judged.inferred) raced.push(judged);
        continue;
      }
      if (judged.inferred) {
        uncertain.push(judged);
        continue;
      }
      const cls: AttributionClass = deleter === "idalloc GC"
        ? "idalloc-only"
        : heldBy.length > 0
        ? "mixed (idalloc's)"
        : "Cilium-only";
      violations.push({
        check: DELETION_CHECK,
        message:
          `${deleter} deleted identity ${c.id} (${c.key}) at ${clock(c.at)} (revision ${c.rev})` +
          (heldBy.length > 0 ? `, held by idalloc node(s) ${heldBy.join(", ")} (live Lease)` : "") +
          (namedBy.length > 0 ? `, named by endpoint(s) of ${namedBy.join(", ")}` : ""),
        evidence: { ...judged, class: cls, marked: c.marked, refs: c.refs },
      });
    }
  }
  return { deletions, byDeleter, violations, uncertain, raced };
}

/**
 * When the record showed node's reference of the key start naming `id` under `epoch`, as it stood
 * before revision `rev`: the recorder's instant of that reference's latest addition; `undefined`
 * when the record's last reference of the pair before `rev` is not that one.
 */
function refSince(
  list: readonly PairRef[] | undefined,
  id: number,
  epoch: string,
  rev: number,
): number | undefined {
  if (list === undefined) return undefined;
  for (let i = list.length - 1; i >= 0; i--) {
    const r = list[i];
    if (r.rev >= rev) continue;
    return r.id === id && r.lease === epoch ? r.at : undefined;
  }
  return undefined;
}

/** idalloc's GC pass that listed `id` as deleted around `at`, if one did (else the operator). */
function passOf(id: number, at: number, passes: readonly GcPass[]): GcPass | undefined {
  return passes.find((p) =>
    p.start <= at && at <= p.end + RECORDER_LAG_MS && (p.deleted ?? []).includes(id)
  );
}

/** An allocate of a key by a node incarnation that answered an ID. */
interface Answered {
  readonly start: number;
  readonly end: number;
  readonly id: number;
  /** Whether the call created the identity (absent in older logs: counted as not). */
  readonly isNew: boolean;
}

/** One event of a node incarnation's hold of a key: an answer, or a last-use release. */
interface HoldEvent {
  /** When it certainly happened: an answer's end, a release's start. */
  readonly t: number;
  /** The ID answered; `undefined`: released. */
  readonly id?: number;
}

/**
 * What each idalloc node answered, from its logs: per incarnation and key, its answers (allocate,
 * get of a held key, a heartbeat's IDs, a `reassigned` event's new ID) and its last-use releases.
 */
export class Holds {
  /** Per node: its incarnations with their first record's time, in order. */
  readonly #incs = new Map<string, { inc: string; first: number }[]>();
  /** Per `inc\0key`: its events by time. */
  readonly #events = new Map<string, HoldEvent[]>();
  /** Per `inc\0key`: its allocates that answered an ID. */
  readonly #allocates = new Map<string, Answered[]>();

  /** @param records the nodes' log records */
  constructor(records: readonly LogRecord[]) {
    const firsts = new Map<string, { node: string; first: number }>();
    const add = (inc: string, key: string, e: HoldEvent) => {
      const name = `${inc}\u0000${key}`;
      const list = this.#events.get(name) ?? [];
      list.push(e);
      this.#events.set(name, list);
    };
    for (const r of records) {
      if (!("inc" in r) || !("node" in r)) continue;
      const t = "start" in r ? r.start : "at" in r ? r.at : undefined;
      if (t !== undefined) {
        const seen = firsts.get(r.inc);
        if (seen === undefined || t < seen.first) firsts.set(r.inc, { node: r.node, first: t });
      }
      if (r.t === "call" && r.ok) {
        if ((r.op === "allocate" || (r.op === "get" && r.held)) && typeof r.id === "number") {
          add(r.inc, r.key, { t: r.end, id: r.id });
          if (r.op === "allocate") {
            const name = `${r.inc}\u0000${r.key}`;
            const list = this.#allocates.get(name) ?? [];
            list.push({ start: r.start, end: r.end, id: r.id, isNew: r.isNew === true });
            this.#allocates.set(name, list);
          }
        } else if (r.op === "release" && r.lastUse === true) {
          add(r.inc, r.key, { t: r.start });
        }
      } else if (r.t === "hb") {
        for (const [key, id] of r.ids) add(r.inc, key, { t: r.end, id });
      } else if (r.t === "reassigned") {
        add(r.inc, r.key, { t: r.at, id: r.newId });
      }
    }
    for (const [inc, { node, first }] of firsts) {
      const list = this.#incs.get(node) ?? [];
      list.push({ inc, first });
      this.#incs.set(node, list);
    }
    for (const list of this.#incs.values()) list.sort((a, b) => a.first - b.first);
    for (const list of this.#events.values()) list.sort((a, b) => a.t - b.t);
  }

  /**
   * Whether `node` held `key` as `id` at `at`: its incarnation running then (the last one started
   * before) had answered the key with `id` last, before `at`, and not released it since; or an
   * allocate of it under way at `at` answered `id` without creating it (its answer may predate
   * `at`: a join that answered without removing the mark, `refs.ts` case 3; a join that lost the
   * identity to the delete and created it again from the claim answers it as new, case 2).
   */
  heldAt(node: string, key: string, id: number, at: number): boolean {
    const inc = (this.#incs.get(node) ?? []).filter((i) => i.first < at).at(-1)?.inc;
    if (inc === undefined) return false;
    const name = `${inc}\u0000${key}`;
    const before = (this.#events.get(name) ?? []).filter((e) => e.t < at);
    if (before.at(-1)?.id === id) return true;
    return (this.#allocates.get(name) ?? []).some((a) =>
      a.start < at && at <= a.end && a.id === id && !a.isNew
    );
  }
}
