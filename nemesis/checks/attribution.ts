/**
 * Whose fault is each history violation of a run beside Cilium nodes. Every violation of the
 * history check is a pair of runs of answers (`history.ts`) that certainly overlapped: one ID for
 * two keys, or one key with two IDs. By who gave those answers it is
 *
 * - **Cilium-only**: both runs are Cilium nodes' (Cilium's own holes: it fences nothing, and its
 *   `UpdateKey` re-creates masters without its mutex or a look at the key's other masters);
 * - **idalloc-only**: both are idalloc's, and so was what made them conflict (idalloc's fault);
 * - **mixed**: Cilium took part — one answer each, or two idalloc answers that both followed the
 *   store while a Cilium write had just split it (its `UpdateKey` re-creating a master beside a
 *   live reference: the nodes move off it, each within its watch's delay). A mixed violation is
 *   **idalloc's** when idalloc answered something no store state justified at the time, or when
 *   an idalloc write made the conflicting master while a live reference contradicted it;
 *   otherwise it is **inherited** from the Cilium side.
 *
 * Beside Cilium's CRD mode (`keyLookup: "oldest"`) two rules read the store differently, as Cilium
 * and idalloc do there. A key's preferred identity is its oldest by `creationTimestamp`, ties to
 * the lowest ID (`prefers` in `store_history.ts`), not by revision. And an idalloc create beside a
 * live reference to another identity of the key is held against idalloc only when that identity
 * was in the record longer than `slackMs` before the create: Cilium's agents create without a
 * lock, so an identity they write while an idalloc node creates is invisible to it (its watch;
 * during an etcd restart the API server's watch cache lags the commits by a second or more), and
 * nothing idalloc can take orders the two creates. That race is the documented limit (two
 * identities; idalloc then joins the older one and drops its own), and the evidence names it
 * (`raced`); what idalloc answers afterwards is still judged by the superseded rule. Nor is an
 * idalloc create beside a Cilium endpoint that names an ID holding no identity of its key at the
 * time (`orphaned`): the agent answered, from a cache that missed the delete, an identity the store
 * no longer had (seed 42's 30-minute run: 534 deleted, an endpoint naming it for k192 written 274
 * ms later, 534 then free for any key).
 *
 * What the store justified is read from its own history (`store_history.ts`). An idalloc answer
 * of key K with ID x was unjustified when, for longer than `slackMs` of the node's running time
 * (the watch's delay; a stopped process learns nothing), the store showed
 * - **taken**: the master of x naming another key; or
 * - **superseded**: a master of K newer than x's (by revision) with a live reference: the ID
 *   Cilium's own lookup gives K from then on (`cache.OnUpsert` keeps a key's newest master), to
 *   which idalloc must move; or
 * - **unreferenced**: no live reference of the node to K for longer than the lease (idalloc
 *   fences itself within its lease; beyond it, an answer from memory is unfounded).
 * A Cilium answer is judged by what the store held when it was given (less the recorder's delay),
 * without the lease's allowance and without excusing a stall: a Cilium node answers from its
 * local keys whatever the store holds, and re-checks nothing when it resumes.
 *
 * For every mixed violation the evidence also says which write made the conflicting master (the
 * newer master of the key, or the master that gave the ID to the other key), whether idalloc's
 * answer agreed with a Cilium node's at the time, how long after the last fault (stall, restart,
 * store crash) it happened, and whether idalloc reported the key `reassigned`.
 *
 * @example
 * ```ts ignore
 * const summary = attribute(violations, { ciliumIncs, store: new StoreHistory(changes), ... });
 * for (const a of summary.attributions) console.log(a.line);
 * ```
 *
 * @module
 */
import type { FaultRecord } from "../faults.ts";
import type { CallFailed, LogRecord, ReassignedRecord } from "../records.ts";
import type { StopWindow } from "./calls.ts";
import { HISTORY_CHECK, type Run, SPLIT_CHECK } from "./history.ts";
import {
  type KeyLookup,
  type MasterSpan,
  prefers,
  type RefSpan,
  type StoreHistory,
  type Writer,
} from "./store_history.ts";
import { clock, type Violation } from "./violation.ts";

/** The classes of a violation, as the report counts them. */
export const ATTRIBUTION_CLASSES = [
  "Cilium-only",
  "idalloc-only",
  "mixed (idalloc's)",
  "mixed (inherited from Cilium)",
] as const;

/** A violation's class. */
export type AttributionClass = typeof ATTRIBUTION_CLASSES[number];

/** The classes that are idalloc's fault (must be 0). */
export const IDALLOC_CLASSES: ReadonlySet<AttributionClass> = new Set([
  "idalloc-only",
  "mixed (idalloc's)",
]);

/** Why the store did not justify a run's answers, or `undefined` when it did. */
export interface Unjustified {
  readonly reason: "taken" | "superseded" | "unreferenced";
  /** When the store started to contradict the answers (the recorder's clock). */
  readonly since: number;
  /** The node's running time between `since` and its last answer in the conflict, ms. */
  readonly runningMs: number;
  readonly detail: string;
}

/** One side of a violation. */
export interface SideEvidence {
  readonly side: "cilium" | "idalloc";
  readonly run: Run;
  /** Set when the store did not justify the run's answers in the conflict. */
  readonly unjustified?: Unjustified;
  /** The node's own reference to the run's key and ID around the conflict (store spans). */
  readonly reference?: { readonly from: number; readonly to?: number; readonly lease: string };
  /** The last stop window of the node's incarnation before the conflict ended. */
  readonly lastStop?: StopWindow;
}

/** What the attribution found for one violation. */
export interface Attribution {
  readonly violation: Violation;
  readonly class: AttributionClass;
  /**
   * What is in conflict: a key (split) or an ID (overlap) in the history, and the certain overlap;
   * the store at the end of the run (`store`), or the probe's call (`probe`) and its span.
   */
  readonly conflict: {
    readonly kind: "split" | "overlap" | "store" | "probe";
    readonly from: number;
    readonly to: number;
  };
  /** The two runs of a history violation, judged; none for the store's and the probe's. */
  readonly sides: readonly SideEvidence[];
  /** The master that made the conflict (the newer master of the key; the other key's master). */
  readonly master?: {
    readonly id: number;
    readonly key: string;
    readonly rev: number;
    readonly at: number;
    readonly writer?: Writer & { readonly side: "cilium" | "idalloc" };
    /** Live references that the store held against it when it was written (`node → id` of key). */
    readonly contradicted: readonly string[];
    /**
     * CRD mode, an idalloc create: those of `contradicted` that name another identity of the key
     * recorded less than `slackMs` before it — a create race with a lock-free Cilium agent, not
     * held against idalloc (see the module doc). Each with how long before the create.
     */
    readonly raced?: readonly string[];
    /**
     * CRD mode, an idalloc create: those of `contradicted` that are Cilium nodes' endpoints naming
     * an ID with no identity of their key when the master was written — Cilium answering, from a
     * cache that had not seen the delete, an identity the store no longer held; an idalloc node
     * that gave a free ID to a key did not contradict anything the store held (see the module
     * doc). Not held against idalloc.
     */
    readonly orphaned?: readonly string[];
  };
  /** Mixed: Cilium incarnations that answered idalloc's key and ID during the conflict. */
  readonly agreedWith?: readonly string[];
  /** The last fault that ended before the conflict, and how long before it. */
  readonly sinceFault?: { readonly label: string; readonly inc?: string; readonly ms: number };
  /** Mixed: idalloc's `reassigned` event for the key, if any, after the conflict began. */
  readonly reassigned?: { readonly oldId: number; readonly newId: number; readonly ms: number };
  /** One line for the report. */
  readonly line: string;
}

/** Refusals with `SplitKeyError`, per key: how many and over how long. */
export interface SplitRefusals {
  readonly calls: number;
  readonly keys: number;
  /** The longest span from a key's first refusal to its last, ms. */
  readonly longestMs: number;
  readonly perKey: ReadonlyArray<
    { readonly key: string; readonly calls: number; readonly from: number; readonly to: number }
  >;
}

/** What {@linkcode attribute} found. */
export interface AttributionSummary {
  readonly counts: Readonly<Record<AttributionClass, number>>;
  readonly attributions: readonly Attribution[];
  readonly splitRefusals: SplitRefusals;
  /** Changes in the store's record (0: no record; the store-based evidence is missing). */
  readonly storeChanges: number;
}

/** What {@linkcode attribute} reads besides the violations. */
export interface AttributionInput {
  /** Cilium node incarnations (every other incarnation is idalloc's). */
  readonly ciliumIncs: ReadonlySet<string>;
  /** Cilium node names (writers are told by node name). */
  readonly ciliumNodes: ReadonlySet<string>;
  readonly store: StoreHistory;
  readonly faults: readonly FaultRecord[];
  readonly stops: readonly StopWindow[];
  /** Every record of the idalloc workers (reassigned events, failed calls). */
  readonly records: readonly LogRecord[];
  /** idalloc's lease TTL, ms. */
  readonly leaseTtlMs: number;
  /** Check names of the store checks and the probe, whose violations are attributed too. */
  readonly checks?: {
    readonly oneLiveId?: string;
    readonly oneKey?: string;
    readonly holds?: string;
    readonly probe?: string;
    readonly drain?: string;
    /** The deletion check beside Cilium CRD-mode nodes (`deletions.ts`): classed already. */
    readonly deletion?: string;
    /**
     * The call check's errors (`calls.ts`) that a Cilium node's writes can cause: an
     * `InvalidIdError` for a key whose identities are all Cilium's, outside idalloc's range.
     */
    readonly errors?: string;
  };
  /**
   * Which of a key's masters Cilium's own lookup gives it: the **newest** (kvstore mode:
   * `cache.OnUpsert` keeps the last one seen) or the **oldest** (CRD mode: its index prefers the
   * oldest `creationTimestamp`). An idalloc answer is superseded by a referenced master that
   * lookup prefers to its own. @default {"newest"}
   */
  readonly keyLookup?: KeyLookup;
  /**
   * How long the store may contradict an answer before it counts (the watch's delay).
   * @default {1000}
   */
  readonly slackMs?: number;
}

/** Classifies every history violation in `violations` (others are ignored). */
export function attribute(
  violations: readonly Violation[],
  input: AttributionInput,
): AttributionSummary {
  const counts = Object.fromEntries(ATTRIBUTION_CLASSES.map((c) => [c, 0])) as Record<
    AttributionClass,
    number
  >;
  const attributions: Attribution[] = [];
  for (const v of violations) {
    const a = attributeOne(v, input);
    if (!a) continue;
    counts[a.class]++;
    attributions.push(a);
  }
  return {
    counts,
    attributions,
    splitRefusals: splitRefusals(input.records),
    storeChanges: input.store.size,
  };
}

interface Pair {
  readonly kind: "split" | "overlap";
  readonly a: Run;
  readonly b: Run;
}

function pairOf(v: Violation): Pair | undefined {
  if (v.check !== HISTORY_CHECK && v.check !== SPLIT_CHECK) return undefined;
  const e = v.evidence as { a?: Run; b?: Run } | undefined;
  if (!e?.a || !e.b) return undefined;
  return { kind: v.check === SPLIT_CHECK ? "split" : "overlap", a: e.a, b: e.b };
}

/** The certain overlap of two runs (as `history.ts` counts it). */
function overlapOf(a: Run, b: Run): { from: number; to: number } {
  return { from: Math.max(a.lo, b.lo), to: Math.min(a.hi, b.hi) };
}

function attributeOne(v: Violation, input: AttributionInput): Attribution | undefined {
  const pair = pairOf(v);
  if (!pair) return attributeStore(v, input);
  const { a, b, kind } = pair;
  const conflict = { kind, ...overlapOf(a, b) };
  const sideOf = (r: Run): "cilium" | "idalloc" =>
    input.ciliumIncs.has(r.inc) ? "cilium" : "idalloc";
  const sides = [a, b].map((run) => judge(run, sideOf(run), conflict, input)) as [
    SideEvidence,
    SideEvidence,
  ];
  const master = conflictingMaster(pair, conflict, input);
  const cilium = sides.filter((s) => s.side === "cilium").length;
  const idallocSide = sides.find((s) => s.side === "idalloc");
  let cls: AttributionClass;
  let why = "";
  // Both answers idalloc's, but the conflicting master a Cilium write against a live reference
  // (its `UpdateKey`), each idalloc answer justified: the nodes were moving off the split Cilium
  // made, each within its watch's delay.
  const ciliumMade = cilium === 0 && master?.writer?.side === "cilium" &&
    master.contradicted.length > 0 && sides.every((s) => !s.unjustified);
  if (cilium === 2) cls = "Cilium-only";
  else if (cilium === 0 && !ciliumMade) cls = "idalloc-only";
  else if (ciliumMade) {
    cls = "mixed (inherited from Cilium)";
    why = `both answers idalloc's and justified; Cilium's write (${master!.writer!.node}) made ` +
      `master ${master!.id} → ${master!.key} beside live references ${
        master!.contradicted.join(", ")
      }`;
  } else if (idallocSide!.unjustified) {
    cls = "mixed (idalloc's)";
    why = `idalloc ${idallocSide!.unjustified.detail}`;
  } else if (
    master?.writer?.side === "idalloc" &&
    master.contradicted.length > (master.raced?.length ?? 0) + (master.orphaned?.length ?? 0)
  ) {
    cls = "mixed (idalloc's)";
    why = `idalloc's write (${master.writer.node}) made master ${master.id} → ${master.key} ` +
      `beside live references ${master.contradicted.join(", ")}`;
  } else {
    cls = "mixed (inherited from Cilium)";
    const c = sides.find((s) => s.side === "cilium")!;
    why = c.unjustified
      ? `Cilium ${c.unjustified.detail}`
      : "both sides justified by the store, no idalloc write against a live reference";
    if (master?.raced?.length) {
      why += `; idalloc's create (${master.writer!.node}) raced a lock-free Cilium create ` +
        `(${master.raced.join(", ")})`;
    }
    if (master?.orphaned?.length) {
      why += `; idalloc's create (${master.writer!.node}) took an ID the store held no identity ` +
        `of, which Cilium's endpoints still named (${master.orphaned.join(", ")})`;
    }
  }
  const mixed = cilium === 1 || ciliumMade;
  const idallocRun = idallocSide?.run;
  const agreedWith = mixed && idallocRun ? agreements(idallocRun, conflict, input) : undefined;
  const reassigned = mixed && idallocRun
    ? reassignedAfter(idallocRun, conflict.from, input.records)
    : undefined;
  const sinceFault = lastFaultBefore(conflict.from, input.faults);
  const parts = [
    `[${cls}] ${v.message}`,
    why,
    master
      ? `master ${master.id} → ${master.key} rev ${master.rev} at ${clock(master.at)} by ${
        master.writer ? `${master.writer.node} (${master.writer.side}, ${master.writer.how})` : "?"
      }`
      : "",
    agreedWith
      ? `idalloc agreed with ${agreedWith.length ? agreedWith.join(", ") : "no Cilium node"}`
      : "",
    sinceFault
      ? `${(sinceFault.ms / 1_000).toFixed(1)} s after ${sinceFault.label}${
        sinceFault.inc ? ` of ${sinceFault.inc}` : ""
      }`
      : "",
    mixed
      ? reassigned
        ? `reassigned ${reassigned.oldId} → ${reassigned.newId} ${reassigned.ms} ms after`
        : "no reassigned event"
      : "",
    mixed ? acrossStop(sides) : "",
  ];
  return {
    violation: v,
    class: cls,
    conflict,
    sides,
    master,
    agreedWith,
    sinceFault,
    reassigned,
    line: parts.filter((p) => p !== "").join("; "),
  };
}

/** How late the recorder may see a change that a node acted on (both on one busy machine). */
const RECORDER_LAG_MS = 250;

/**
 * For a mixed violation after a stop of the idalloc node: whether the Cilium side's reference
 * (its hold in the store) ended while the idalloc node was stopped, or lasted past its resume.
 */
function acrossStop(sides: readonly SideEvidence[]): string {
  const idalloc = sides.find((s) => s.side === "idalloc");
  const cilium = sides.find((s) => s.side === "cilium");
  const stop = idalloc?.lastStop;
  if (!stop || !cilium) return "";
  const ref = cilium.reference;
  const who = `${idalloc!.run.inc} stopped ${clock(stop.from)}–${clock(stop.to)}`;
  if (!ref) return `${who}; Cilium's answers had no reference of their own in the store`;
  if (ref.to !== undefined && ref.to <= stop.to) {
    return `${who}; Cilium's reference ended ${clock(ref.to)}, while it was stopped`;
  }
  return `${who}; Cilium's reference (from ${clock(ref.from)}) lasted past the resume` +
    (ref.to === undefined ? "" : `, until ${clock(ref.to)}`);
}

/** Running time of `inc` in `[from, to]`, less its stop windows. */
function runningMs(inc: string, from: number, to: number, stops: readonly StopWindow[]): number {
  let ms = Math.max(0, to - from);
  for (const w of stops) {
    if (w.inc !== inc) continue;
    ms -= Math.max(0, Math.min(to, w.to) - Math.max(from, w.from));
  }
  return Math.max(0, ms);
}

/**
 * Judges one run's answers in the conflict against the store (see the module doc). A contradicting
 * master counts over the time it certainly existed (from when it was seen written until the
 * earliest it can have been deleted); the node's own reference over the time it possibly existed.
 * A point (one answer, or a store read) happened at some instant of its window: it is judged at
 * the last one, so a change in its window counts for it.
 */
function judge(
  run: Run,
  side: "cilium" | "idalloc",
  conflict: { from: number; to: number },
  input: AttributionInput,
): SideEvidence {
  const { store, stops } = input;
  const slack = input.slackMs ?? 1_000;
  // The run's last answer in the conflict.
  const last = run.point ? run.hi : conflict.to;
  const lastStop = stops.filter((w) => w.inc === run.inc && w.from < conflict.to)
    .sort((x, y) => y.to - x.to)[0];
  const own = store.refsOf(run.key, run.node).filter((r) =>
    r.id === run.id && r.fromEarly <= conflict.to && (r.to === undefined || r.to >= conflict.from)
  );
  const reference = own[0] ? { from: own[0].from, to: own[0].to, lease: own[0].lease } : undefined;
  const found: Unjustified[] = [];
  /** Records `reason` if the store contradicted the run over `[since, until]` for too long. */
  const check = (
    reason: Unjustified["reason"],
    since: number,
    until: number,
    detail: string,
    allow = slack,
  ) => {
    // The contradiction must certainly hold while the node answered: a point is judged at its
    // last instant, a run over the conflict.
    if (run.point ? until < last : until <= conflict.from) return;
    const end = Math.min(until, last);
    if (side === "cilium") {
      // A Cilium node checks nothing before it answers from its local keys (after a stall too):
      // what the store held when it answered judges it, less the recorder's own delay.
      const ms = end - since;
      if (ms > RECORDER_LAG_MS) found.push({ reason, since, runningMs: ms, detail });
      return;
    }
    const ms = runningMs(run.inc, since, end, stops);
    // A run that began after the node resumed from a stop follows a re-check of the store: what
    // changed before the resume was known to it, but for the recorder's own delay.
    const resumed = stops.some((w) => w.inc === run.inc && since < w.to && w.to <= run.lo);
    if (ms > allow || (resumed && ms > RECORDER_LAG_MS)) {
      found.push({ reason, since, runningMs: ms, detail });
    }
  };
  // Taken: x's master named another key.
  for (const m of store.mastersOfIdDuring(run.id, conflict.from, last)) {
    if (m.key === run.key) continue;
    check(
      "taken",
      m.from,
      m.toEarly ?? Infinity,
      `answered ${run.key} → ${run.id} while master ${run.id} named ${m.key} (since ${
        clock(m.from)
      })`,
    );
  }
  // Superseded: a master of the key that Cilium's lookup prefers, with a live reference. Against
  // the run's own master at its most preferred (it may have been deleted and written again); an
  // exact tie of creation times excuses a Cilium answer (its sort is not stable), not idalloc's.
  const lookup = input.keyLookup ?? "newest";
  const oldest = lookup === "oldest";
  const ties = side === "cilium" ? "either" : "lowest-id";
  const ownMaster = store.mastersOfKeyDuring(run.key, conflict.from, last)
    .filter((m) => m.id === run.id)
    .reduce<MasterSpan | undefined>((a, b) => a && !prefers(b, a, lookup) ? a : b, undefined);
  for (const m of store.mastersOfKeyDuring(run.key, conflict.from, last)) {
    if (m.id === run.id || ownMaster === undefined) continue;
    if (!prefers(m, ownMaster, lookup, ties)) continue;
    const refs = store.refsToDuring(run.key, m.id, Math.max(m.from, conflict.from), last)
      .filter((r) => r.lease !== "0");
    if (refs.length === 0) continue;
    const referenced = Math.min(...refs.map((r) => r.from));
    check(
      "superseded",
      Math.max(m.from, referenced),
      Math.min(m.toEarly ?? Infinity, Math.max(...refs.map((r) => r.toEarly ?? Infinity))),
      `kept answering ${run.key} → ${run.id} after its ${
        oldest ? "older" : "newer"
      } master ${m.id} (${clock(m.from)}) was referenced`,
    );
  }
  // Unreferenced: no live reference of the node to the key for longer than the lease (idalloc)
  // or at all (Cilium: it never fences). A point may be a store read, which no hold backs.
  const gapStart = run.point ? undefined : unreferencedSince(run, last, input);
  if (gapStart !== undefined) {
    check(
      "unreferenced",
      gapStart,
      Infinity,
      `answered ${run.key} → ${run.id} with no live reference of its own since ${clock(gapStart)}`,
      input.leaseTtlMs + slack,
    );
  }
  // The most telling reason first: another key's master, a newer master, then no reference.
  const order: Unjustified["reason"][] = ["taken", "superseded", "unreferenced"];
  found.sort((x, y) => order.indexOf(x.reason) - order.indexOf(y.reason) || x.since - y.since);
  return { side, run, unjustified: found[0], reference, lastStop };
}

/**
 * Since when the node had certainly had no live reference naming the run's ID at the run's last
 * answer in the conflict (`undefined`: it had one then, possibly, or the store kept no record).
 */
function unreferencedSince(
  run: Run,
  last: number,
  { store }: AttributionInput,
): number | undefined {
  if (store.size === 0) return undefined;
  const spans = store.refsOf(run.key, run.node).filter((r) => r.id === run.id && r.lease !== "0");
  if (spans.some((s) => s.fromEarly <= last && (s.to === undefined || s.to > last))) {
    return undefined;
  }
  // A reference written and dropped while the record was blind never reached it (the 30-minute
  // run, seed 42: a join and its release within a forced 410 of the reference objects' watch).
  if (store.blindAt(last)) return undefined;
  // The gap began when the latest reference before it ended; with none, at the run's start.
  const ends = spans.filter((s) => s.fromEarly <= last).map((s) => s.to!);
  return ends.length > 0 ? Math.max(...ends) : run.lo;
}

/** The master behind the conflict: the key's newer master (split), the other key's (overlap). */
function conflictingMaster(
  { kind, a, b }: Pair,
  conflict: { from: number; to: number },
  input: AttributionInput,
): Attribution["master"] {
  const { store } = input;
  let candidates: MasterSpan[];
  if (kind === "split") {
    candidates = store.mastersOfKeyDuring(a.key, conflict.from, conflict.to)
      .filter((m) => m.id === a.id || m.id === b.id);
  } else {
    candidates = store.mastersOfIdDuring(a.id, conflict.from, conflict.to);
  }
  if (candidates.length === 0) return undefined;
  // The newest of them made the conflict: the older one was there first.
  const m = candidates.sort((x, y) => y.fromRev - x.fromRev)[0];
  const writer = store.writerOf(m);
  const side = writer && (input.ciliumNodes.has(writer.node) ? "cilium" : "idalloc");
  const contradicted = store.contradictedAtWrite(m);
  const crdCreate = input.keyLookup === "oldest" && side === "idalloc";
  const raced = crdCreate
    ? racedCreates(m, contradicted, store, input.slackMs ?? 1_000)
    : undefined;
  const orphaned = crdCreate ? orphanedRefs(m, contradicted, store, input.ciliumNodes) : undefined;
  return {
    id: m.id,
    key: m.key,
    rev: m.fromRev,
    at: m.from,
    contradicted: contradicted.map((r) => `${r.key}@${r.node} → ${r.id}`),
    ...(raced ? { raced } : {}),
    ...(orphaned?.length ? { orphaned } : {}),
    writer: writer ? { ...writer, side: side! } : undefined,
  };
}

/**
 * CRD mode: the references of `contradicted` that name another identity of `master`'s key which
 * the record had held for less than `slackMs` when `master` was written — an idalloc create that
 * raced a lock-free Cilium create (see the module doc) — as `key@node → id (N ms before)`.
 */
function racedCreates(
  master: MasterSpan,
  contradicted: readonly RefSpan[],
  store: StoreHistory,
  slackMs: number,
): string[] {
  const out: string[] = [];
  for (const r of contradicted) {
    if (r.key !== master.key) continue;
    const other = store.mastersOfIdDuring(r.id, master.from, master.from)
      .find((o) => o.key === master.key && o.fromRev < master.fromRev);
    if (!other || master.from - other.from >= slackMs) continue;
    out.push(
      `${r.key}@${r.node} → ${r.id}, whose identity was recorded ${
        master.from - other.from
      } ms before`,
    );
  }
  return out;
}

/**
 * CRD mode: the references of `contradicted` that are Cilium nodes' endpoints naming an ID that
 * had no master of their key when `master` was written (see `orphaned` in {@linkcode Attribution}),
 * as `key@node → id`.
 */
function orphanedRefs(
  master: MasterSpan,
  contradicted: readonly RefSpan[],
  store: StoreHistory,
  ciliumNodes: ReadonlySet<string>,
): string[] {
  return contradicted
    .filter((r) =>
      ciliumNodes.has(r.node) &&
      !store.mastersOfIdDuring(r.id, master.from, master.from).some((o) => o.key === r.key)
    )
    .map((r) => `${r.key}@${r.node} → ${r.id}, which had no identity of its key`);
}

/** Cilium incarnations whose answers of the idalloc run's key and ID overlapped the conflict. */
function agreements(
  run: Run,
  conflict: { from: number; to: number },
  input: AttributionInput,
): string[] {
  const out = new Set<string>();
  for (const r of input.records) {
    if (r.t !== "call" || !r.ok || !input.ciliumIncs.has(r.inc)) continue;
    if (r.key !== run.key || r.id !== run.id || r.op === "release") continue;
    if (r.end >= conflict.from && r.start <= conflict.to) out.add(r.inc);
  }
  // A Cilium hold that spans the conflict without an answer inside it: its reference tells.
  for (const ref of input.store.refsToDuring(run.key, run.id, conflict.from, conflict.to)) {
    if (input.ciliumNodes.has(ref.node)) out.add(`${ref.node} (reference)`);
  }
  return [...out].sort();
}

function reassignedAfter(
  run: Run,
  from: number,
  records: readonly LogRecord[],
): Attribution["reassigned"] {
  const ev = records
    .filter((r): r is ReassignedRecord =>
      r.t === "reassigned" && r.inc === run.inc && r.key === run.key && r.oldId === run.id &&
      r.at >= from
    )
    .sort((x, y) => x.at - y.at)[0];
  return ev ? { oldId: ev.oldId, newId: ev.newId, ms: ev.at - from } : undefined;
}

function lastFaultBefore(at: number, faults: readonly FaultRecord[]): Attribution["sinceFault"] {
  const f = faults
    .filter((f) => !f.error && (f.backAt ?? f.end) <= at)
    .sort((x, y) => (y.backAt ?? y.end) - (x.backAt ?? x.end))[0];
  return f
    ? { label: f.label, inc: f.restartedAs ?? f.inc, ms: at - (f.backAt ?? f.end) }
    : undefined;
}

/** Counts the calls that failed with `SplitKeyError`, per key. */
export function splitRefusals(records: readonly LogRecord[]): SplitRefusals {
  const perKey = new Map<string, { key: string; calls: number; from: number; to: number }>();
  let calls = 0;
  for (const r of records) {
    if (r.t !== "call" || r.ok || (r as CallFailed).error !== "SplitKeyError") continue;
    calls++;
    const k = perKey.get(r.key);
    if (!k) perKey.set(r.key, { key: r.key, calls: 1, from: r.start, to: r.end });
    else {
      k.calls++;
      k.from = Math.min(k.from, r.start);
      k.to = Math.max(k.to, r.end);
    }
  }
  const list = [...perKey.values()].sort((x, y) => y.calls - x.calls);
  return {
    calls,
    keys: list.length,
    longestMs: list.reduce((m, k) => Math.max(m, k.to - k.from), 0),
    perKey: list,
  };
}

/** The end state's violations and the probe's failures (see the module doc). */
function attributeStore(v: Violation, input: AttributionInput): Attribution | undefined {
  const names = input.checks ?? {};
  const side = (node: string) => input.ciliumNodes.has(node) ? "cilium" : "idalloc";
  const done = (cls: AttributionClass, why: string, kind: "store" | "probe" = "store") => ({
    violation: v,
    class: cls,
    conflict: { kind, from: NaN, to: NaN },
    sides: [],
    line: `[${cls}] ${v.message}; ${why}`,
  });
  if (v.check === names.holds) return done("idalloc-only", "a hold of an idalloc node");
  if (v.check === names.deletion) {
    const e = v.evidence as { class?: AttributionClass; deleter?: string } | undefined;
    if (!e?.class) return undefined;
    return done(e.class, `deleted by ${e.deleter}`);
  }
  if (v.check === names.oneKey) {
    const r = (v.evidence as { reference?: { node: string } } | undefined)?.reference;
    if (!r) return undefined;
    return side(r.node) === "cilium"
      ? done("Cilium-only", `the reference is Cilium node ${r.node}'s`)
      : done("idalloc-only", `the reference is idalloc node ${r.node}'s`);
  }
  if (v.check === names.oneLiveId) {
    const e = v.evidence as {
      key?: string;
      refs?: ReadonlyArray<{ node: string; id: number; live: boolean }>;
    } | undefined;
    if (!e?.key || !e.refs) return undefined;
    const live = e.refs.filter((r) => r.live);
    const ours = new Set(live.filter((r) => side(r.node) === "idalloc").map((r) => r.id));
    if (ours.size === 0) return done("Cilium-only", "only Cilium nodes reference the key");
    if (ours.size > 1) {
      return done("idalloc-only", `idalloc nodes reference IDs ${[...ours].join(", ")}`);
    }
    const [mine] = ours;
    const lookup = input.keyLookup ?? "newest";
    const newest = preferredReferenced(e.key, live.map((r) => r.id), input.store, lookup);
    return newest === undefined || newest === mine
      ? done(
        "mixed (inherited from Cilium)",
        `idalloc's nodes are on ${mine}, its ${lookup} referenced master; Cilium nodes hold ${
          [...new Set(live.filter((r) => side(r.node) === "cilium").map((r) => r.id))].join(", ")
        }`,
      )
      : done(
        "mixed (idalloc's)",
        `idalloc's nodes are on ${mine}, not on ${newest}, the key's ${lookup} referenced master`,
      );
  }
  if (v.check === names.probe) return attributeProbe(v, input, done);
  if (v.check === names.errors) return attributeError(v, input, done);
  if (v.check === names.drain) return attributeDrain(v, input, done);
  return undefined;
}

/**
 * Masters GC left after the drain: Cilium's (inherited) when each of them has a Cilium mutex of
 * its key or ID still held as the drain gave up (a stale lock: GC honours it), idalloc's otherwise.
 */
function attributeDrain(
  v: Violation,
  { store }: AttributionInput,
  done: (cls: AttributionClass, why: string) => Attribution,
): Attribution | undefined {
  const e = v.evidence as
    | { left?: ReadonlyArray<{ id: number; key: string }>; until?: number }
    | undefined;
  if (!e?.left || e.until === undefined) return undefined;
  const at = e.until;
  const locked = e.left.map((
    m,
  ) => [...store.locksDuring(m.key, at, at), ...store.locksDuring(`id/${m.id}`, at, at)]);
  if (locked.every((l) => l.length > 0)) {
    return done(
      "mixed (inherited from Cilium)",
      `a Cilium mutex of each was still held (lock lease ${
        [...new Set(locked.flat().map((l) => `${l.lease} on ${l.of} since ${clock(l.from)}`))]
          .join(", ")
      })`,
    );
  }
  return done("idalloc-only", "GC is idalloc's");
}

/**
 * The master among `ids` naming `key` (at the end of the record) that Cilium's lookup prefers
 * (`prefers`: the newest by revision, or the oldest by creation time).
 */
function preferredReferenced(
  key: string,
  ids: readonly number[],
  store: StoreHistory,
  lookup: KeyLookup,
): number | undefined {
  let best: MasterSpan | undefined;
  for (const id of new Set(ids)) {
    const m = store.mastersOfIdDuring(id, Infinity, Infinity).find((x) => x.key === key);
    if (!m) continue;
    if (!best || prefers(m, best, lookup)) best = m;
  }
  return best?.id;
}

/**
 * A key the probe could not allocate: Cilium's (inherited) when a Cilium mutex of the key was
 * held through the whole call (a stale lock: Cilium's own nodes are stuck on it too), or when a
 * Cilium node's live reference names an ID whose master names another key (nothing valid to
 * join: refused as corrupt) or splits the key with no master naming it; idalloc's otherwise.
 */
function attributeProbe(
  v: Violation,
  input: AttributionInput,
  done: (cls: AttributionClass, why: string, kind: "probe") => Attribution,
): Attribution | undefined {
  const r = (v.evidence as { record?: CallFailed } | undefined)?.record;
  if (!r) return undefined;
  const cause = ciliumCauseOfFailure(r, input);
  return cause === undefined
    ? done("idalloc-only", "the probe is idalloc's", "probe")
    : done("mixed (inherited from Cilium)", cause, "probe");
}

/**
 * A call that failed with an error a Cilium node's writes can cause (`InvalidIdError`: the key's
 * only identities are Cilium's, with IDs outside idalloc's range, which idalloc refuses rather than
 * create a second identity of the key): Cilium's (inherited) when {@linkcode ciliumCauseOfFailure}
 * finds that cause, idalloc's otherwise.
 */
function attributeError(
  v: Violation,
  input: AttributionInput,
  done: (cls: AttributionClass, why: string) => Attribution,
): Attribution | undefined {
  const r = v.evidence as CallFailed | undefined;
  if (!r || r.ok !== false) return undefined;
  const cause = r.error === "InvalidIdError" ? ciliumCauseOfFailure(r, input) : undefined;
  return cause === undefined
    ? done("idalloc-only", `${r.error} is idalloc's answer`)
    : done("mixed (inherited from Cilium)", cause);
}

/**
 * Why a failed call of key `r.key` is Cilium's doing, or `undefined` (see
 * {@linkcode attributeProbe}).
 */
function ciliumCauseOfFailure(r: CallFailed, input: AttributionInput): string | undefined {
  const { store } = input;
  const locked = store.locksDuring(r.key, r.start, r.end)
    .filter((l) => l.from <= r.start && (l.to === undefined || l.to >= r.end));
  if (locked.length > 0) {
    return `Cilium's mutex of the key was held through the call (lock lease ${
      locked.map((l) => l.lease).join(", ")
    } since ${clock(Math.min(...locked.map((l) => l.from)))})`;
  }
  const refs = store.refsAt(r.key, r.start).filter((x) => x.lease !== "0");
  const foreign = refs.filter((x) =>
    input.ciliumNodes.has(x.node) && store.masterAt(x.id, r.start)?.key !== r.key
  );
  if (foreign.length > 0) {
    return `Cilium references ${
      foreign.map((x) => `${x.node} → ${x.id}`).join(", ")
    } name IDs with no master of the key`;
  }
  // The key's only identities when the probe ran were Cilium's writes (CRD mode: an agent
  // re-creating one it cached, e.g. with an ID outside idalloc's range): idalloc refuses them.
  const masters = store.mastersOfKeyDuring(r.key, r.start, r.start);
  const writers = masters.map((m) => store.writerOf(m)?.node);
  if (masters.length > 0 && writers.every((w) => w !== undefined && input.ciliumNodes.has(w))) {
    return `the key's identities ${masters.map((m) => m.id).join(", ")} were written by ` +
      `Cilium node(s) ${[...new Set(writers)].join(", ")}`;
  }
  // Identities outside the failing node's range are no idalloc node's writes (candidates and
  // re-creations stay inside it): a Cilium agent's whose answer the record never saw (killed at
  // once; the 30-minute run, seed 42: 11938 and 34364), or a planted one's leftover ID.
  const range = /outside this allocator's range \[(\d+), (\d+)\]/.exec(r.message ?? "");
  const outside = (id: number) =>
    range !== null && (id < Number(range[1]) || id > Number(range[2]));
  const noIdallocWriter = writers.every((w) => w === undefined || input.ciliumNodes.has(w));
  if (masters.length > 0 && noIdallocWriter && masters.every((m) => outside(m.id))) {
    return `the key's identities ${masters.map((m) => m.id).join(", ")} lie outside idalloc's ` +
      `range [${range![1]}, ${range![2]}]: no idalloc node writes them`;
  }
  return undefined;
}
