/**
 * The history check: no ID was answered to a caller for one key while another key held it.
 *
 * Every answer is a call that resolved with an ID for a key, at some unknown instant between the
 * call's `start` and `end`. Answers a worker gives from its own hold of a key (allocate, get of a
 * held key, each key of a heartbeat, a `reassigned` event) are grouped per worker incarnation and key into **runs**: a run
 * is the answers with one ID between two last-use releases (a `reassigned` event, or any other ID,
 * starts a new run). A run certainly covered the span from the end of its first answer to the start
 * of its last one, its **core**: the node answered the key with that ID at an instant at or before
 * the core and at or after it, and held the key the whole time between.
 *
 * A stop window of the node's process (SIGSTOP to SIGCONT) between two answers of a hold ends a
 * run too, and only that: the node must re-prove its claim before answering again, and its
 * answers after the stall count as a new run. (`maxGapMs` can also end runs at long silences.)
 *
 * For each ID, two cores of different keys must not overlap; for each key, two cores of different
 * IDs must not either (a key split between two IDs). A single answer and every store read
 * (`getNoCache`) is a **point**: it happened somewhere in its `[start, end]`, so it conflicts only
 * when that whole window lies inside a core. The bounds are the conservative ones, so a correct
 * allocator never fails this check, whatever the timing.
 *
 * It also checks, within a run of held answers, that a held key's ID changes only through a
 * `reassigned` event (plain allocators; the identity layer reports no such event), and that no
 * answer names an old ID after the event that replaced it.
 *
 * @example
 * ```ts ignore
 * const violations = checkHistory(records, { slackMs: 2 });
 * ```
 * @module
 */
import type { CallOk, LogRecord, ReassignedRecord } from "../records.ts";
import type { StopWindow } from "./calls.ts";
import { capViolations, clock, type Violation } from "./violation.ts";

/** One answer: `key → id`, given at an instant in `[start, end]`. */
export interface Answer {
  readonly node: string;
  readonly inc: string;
  readonly key: string;
  readonly id: number;
  readonly start: number;
  readonly end: number;
  /** What answered: a hold (`allocate`, `get`, `reassigned`) or a store `read`. */
  readonly source: "allocate" | "get" | "reassigned" | "read";
}

/** Consecutive answers of one key with one ID by one holder, or one point answer. */
export interface Run {
  readonly node: string;
  readonly inc: string;
  readonly key: string;
  readonly id: number;
  /** Core start (end of the first answer) or, for a point, its window start. */
  readonly lo: number;
  /** Core end (start of the last answer) or, for a point, its window end. */
  readonly hi: number;
  /** True when the run is a single instant somewhere in `[lo, hi]`. */
  readonly point: boolean;
  readonly answers: number;
}

/** Options of {@linkcode checkHistory}. */
export interface HistoryOptions {
  /** Clock slack in ms: overlaps shorter than this are not reported. @default {2} */
  readonly slackMs?: number;
  /**
   * A silence longer than this between two answers of one hold ends its run: a node that could
   * not answer for longer than its lease (it was stopped, or fenced) must re-prove its claim before
   * answering again, and what it answers after is a new run, even with the same ID. Unset, a hold
   * is one run however long its silences (then an ID collected, used by another key and freed
   * again while the holder was stopped counts against the holder).
   */
  readonly maxGapMs?: number;
  /**
   * When each incarnation was stopped (SIGSTOP to SIGCONT). A stopped process cannot be told
   * anything, so a stop window between two answers of a hold ends its run: only the window itself
   * is excused. The answers after it form a new run, which must not overlap another holder's.
   */
  readonly stops?: readonly StopWindow[];
  /** Incarnations whose held IDs may change without a `reassigned` event (identity workers). */
  readonly silentChangeAllowed?: ReadonlySet<string>;
  /** Violations reported per kind before the rest are only counted. @default {25} */
  readonly limit?: number;
}

/** What {@linkcode checkHistory} found. */
export interface HistoryResult {
  readonly runs: number;
  readonly answers: number;
  readonly overlaps: Violation[];
  /** One key answered with two IDs at once (by different holders). */
  readonly splits: Violation[];
  readonly idChanges: Violation[];
  /** Violations beyond the limit, per check name. */
  readonly dropped: Record<string, number>;
}

/** Check names of the history. */
export const HISTORY_CHECK = "history: no ID answered for two keys at once";
/** Check name of keys answered with two IDs at once. */
export const SPLIT_CHECK = "history: no key answered with two IDs at once";
/** Check name of held-ID changes. */
export const ID_CHANGE_CHECK = "held IDs change only by a reassigned event";

type Event =
  | {
    kind: "answer";
    answer: Answer;
    /** For a `reassigned` event: the ID it retired. */
    retires?: number;
  }
  | { kind: "release"; start: number; end: number };

/** Builds the runs of a history (exported for tests and diagnosis). */
export function buildRuns(
  records: readonly LogRecord[],
  options: HistoryOptions = {},
  idChanges: Violation[] = [],
): { runs: Run[]; answers: number } {
  const episodes = new Map<string, Event[]>();
  const runs: Run[] = [];
  let answers = 0;
  const push = (inc: string, key: string, event: Event) => {
    const k = `${inc}\u0000${key}`;
    let list = episodes.get(k);
    if (!list) episodes.set(k, list = []);
    list.push(event);
  };
  for (const r of records) {
    if (r.t === "reassigned") {
      push(r.inc, r.key, { kind: "answer", answer: reassignedAnswer(r), retires: r.oldId });
      answers++;
      continue;
    }
    if (r.t === "hb") {
      for (const [key, id] of r.ids) {
        const answer: Answer = {
          node: r.node,
          inc: r.inc,
          key,
          id,
          start: r.start,
          end: r.end,
          source: "get",
        };
        push(r.inc, key, { kind: "answer", answer });
        answers++;
      }
      continue;
    }
    if (r.t !== "call" || !r.ok) continue;
    if (r.op === "release") {
      if (r.lastUse) push(r.inc, r.key, { kind: "release", start: r.start, end: r.end });
      continue;
    }
    if (r.id === undefined) continue;
    if (r.op === "getNoCache") {
      answers++;
      runs.push({ ...base(r), lo: r.start, hi: r.end, point: true, answers: 1 });
      continue;
    }
    if (r.op === "allocate" || (r.op === "get" && r.held)) {
      answers++;
      push(r.inc, r.key, { kind: "answer", answer: holdAnswer(r) });
    }
  }
  for (const events of episodes.values()) {
    events.sort((a, b) => startOf(a) - startOf(b));
    runs.push(...runsOfEpisode(events, options, idChanges));
  }
  return { runs, answers };
}

function base(r: CallOk): Pick<Run, "node" | "inc" | "key" | "id"> {
  return { node: r.node, inc: r.inc, key: r.key, id: r.id! };
}

function holdAnswer(r: CallOk): Answer {
  return {
    ...base(r),
    start: r.start,
    end: r.end,
    source: r.op === "allocate" ? "allocate" : "get",
  };
}

function reassignedAnswer(r: ReassignedRecord): Answer {
  return {
    node: r.node,
    inc: r.inc,
    key: r.key,
    id: r.newId,
    start: r.at,
    end: r.at,
    source: "reassigned",
  };
}

/**
 * Where an event falls in its key's episode: an answer at its start, a last-use release at its
 * end — the key is held until the release returns, so an event during it (a `reassigned` of the
 * hold it ends) belongs to that hold.
 */
function startOf(e: Event): number {
  return e.kind === "answer" ? e.answer.start : e.end;
}

function runsOfEpisode(
  events: readonly Event[],
  options: HistoryOptions,
  idChanges: Violation[],
): Run[] {
  const runs: Run[] = [];
  // A last-use release ends a hold: each stretch between two is judged on its own.
  let segment: Event[] = [];
  for (const e of events) {
    if (e.kind === "release") {
      runs.push(...runsOfHold(segment, options, idChanges));
      segment = [];
    } else segment.push(e);
  }
  runs.push(...runsOfHold(segment, options, idChanges));
  return runs;
}

function runsOfHold(
  events: readonly Event[],
  options: HistoryOptions,
  idChanges: Violation[],
): Run[] {
  const runs: Run[] = [];
  let first: Answer | undefined;
  let last: Answer | undefined;
  let count = 0;
  // The worker may read the new ID before its watch delivers the event: a change is announced
  // by an event of this hold wherever it falls.
  const announced = new Set<string>();
  /**
   * IDs a `reassigned` event retired in this hold: from the event's time until a later event moves
   * the key back to that ID (a node fenced twice may return to its first ID once it is free again).
   */
  const retired = new Map<number, { readonly from: number; until: number }>();
  for (const e of events) {
    if (e.kind === "answer" && e.retires !== undefined) {
      announced.add(`${e.retires}>${e.answer.id}`);
    }
  }
  const close = () => {
    if (first && last) {
      const lo = first.end;
      const hi = last.start;
      runs.push(
        lo < hi
          ? { ...runKey(first), lo, hi, point: false, answers: count }
          : { ...runKey(first), lo: first.start, hi: first.end, point: true, answers: count },
      );
    }
    first = last = undefined;
    count = 0;
  };
  for (const e of events) {
    if (e.kind !== "answer") continue;
    const a = e.answer;
    if (e.retires !== undefined) {
      retired.set(e.retires, { from: a.start, until: Number.POSITIVE_INFINITY });
      const back = retired.get(a.id);
      if (back !== undefined && back.until > a.start) back.until = a.start;
    } else {
      const window = retired.get(a.id);
      if (window !== undefined && a.start > window.from && a.start < window.until) {
        const retiredAt = window.from;
        idChanges.push({
          check: ID_CHANGE_CHECK,
          message: `${a.node} (${a.inc}) answered ${a.key} → ${a.id} at ${
            clock(a.start)
          }, after a reassigned event retired that ID at ${clock(retiredAt)}`,
          evidence: { answer: a, retiredAt },
        });
      } else if (
        last && last.id !== a.id && !announced.has(`${last.id}>${a.id}`) &&
        !options.silentChangeAllowed?.has(a.inc)
      ) {
        idChanges.push({
          check: ID_CHANGE_CHECK,
          message: `${a.node} (${a.inc}) held ${a.key} as ${last.id}, then answered ${a.id} at ${
            clock(a.start)
          } without a reassigned event`,
          evidence: { before: last, after: a },
        });
      }
    }
    const silent = last !== undefined && (
      (options.maxGapMs !== undefined && a.start - last.end > options.maxGapMs) ||
      stoppedBetween(options.stops, a.inc, last.end, a.start)
    );
    if (last && (last.id !== a.id || silent)) close();
    first ??= a;
    last = a;
    count++;
  }
  close();
  return runs;
}

/** Whether incarnation `inc` was stopped at some instant between `from` and `to`. */
function stoppedBetween(
  stops: readonly StopWindow[] | undefined,
  inc: string,
  from: number,
  to: number,
): boolean {
  return stops?.some((w) => w.inc === inc && w.from < to && w.to > from) ?? false;
}

function runKey(a: Answer): Pick<Run, "node" | "inc" | "key" | "id"> {
  return { node: a.node, inc: a.inc, key: a.key, id: a.id };
}

/**
 * Pairs of runs in one group (same ID, or same key) that `differ` (other key, or other ID) and
 * certainly overlap: two cores sharing more than `slack` ms, or a point whose whole window lies in
 * a core. Each pair of holders is reported once per group: one incident shows up as many pairs
 * of answers.
 */
function conflicts<G>(
  runs: readonly Run[],
  slack: number,
  group: (r: Run) => G,
  differ: (a: Run, b: Run) => boolean,
  describe: (a: Run, b: Run, from: number, to: number) => Violation,
): Violation[] {
  const groups = new Map<G, Run[]>();
  for (const run of runs) {
    const g = group(run);
    let list = groups.get(g);
    if (!list) groups.set(g, list = []);
    list.push(run);
  }
  const out: Violation[] = [];
  for (const list of groups.values()) {
    const seen = new Set<string>();
    const report = (a: Run, b: Run, from: number, to: number) => {
      const pair = [`${a.inc}/${a.key}/${a.id}`, `${b.inc}/${b.key}/${b.id}`].sort().join("|");
      if (seen.has(pair)) return;
      seen.add(pair);
      out.push(describe(a, b, from, to));
    };
    const cores = list.filter((r) => !r.point).sort((x, y) => x.lo - y.lo);
    // Sweep the cores in start order, keeping those still open.
    let open: Run[] = [];
    for (const core of cores) {
      open = open.filter((o) => o.hi - slack > core.lo);
      for (const o of open) {
        const from = Math.max(o.lo, core.lo);
        const to = Math.min(o.hi, core.hi);
        if (differ(o, core) && to - from > slack) report(o, core, from, to);
      }
      open.push(core);
    }
    for (const point of list) {
      if (!point.point) continue;
      for (const core of cores) {
        if (core.lo > point.lo) break;
        if (differ(core, point) && core.lo + slack <= point.lo && point.hi <= core.hi - slack) {
          report(core, point, point.lo, point.hi);
        }
      }
    }
  }
  return out;
}

/** Runs the history check over every record of a run (see the module doc). */
export function checkHistory(
  records: readonly LogRecord[],
  options: HistoryOptions = {},
): HistoryResult {
  const slack = options.slackMs ?? 2;
  const limit = options.limit ?? 25;
  const idChanges: Violation[] = [];
  const { runs, answers } = buildRuns(records, options, idChanges);
  const overlaps = conflicts(
    runs,
    slack,
    (r) => r.id,
    (a, b) => a.key !== b.key,
    (a, b, from, to) => ({
      check: HISTORY_CHECK,
      message: `ID ${a.id} was answered for ${a.key} by ${a.node} and for ${b.key} by ${b.node} ` +
        `at once, ${clock(from)}–${clock(to)} (${to - from} ms)`,
      evidence: { id: a.id, a, b },
    }),
  );
  const splits = conflicts(
    runs,
    slack,
    (r) => r.key,
    (a, b) => a.id !== b.id,
    (a, b, from, to) => ({
      check: SPLIT_CHECK,
      message: `${a.key} was answered as ${a.id} by ${a.node} and as ${b.id} by ${b.node} ` +
        `at once, ${clock(from)}–${clock(to)} (${to - from} ms)`,
      evidence: { key: a.key, a, b },
    }),
  );
  const dropped: Record<string, number> = {};
  return {
    runs: runs.length,
    answers,
    overlaps: capViolations(overlaps, limit, dropped),
    splits: capViolations(splits, limit, dropped),
    idChanges: capViolations(idChanges, limit, dropped),
    dropped,
  };
}
