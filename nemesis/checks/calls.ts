/**
 * Checks over the calls themselves: every call ends within its deadline signal (no hang), and
 * every failure is one of idalloc's documented typed errors that the situation allows. Also counts
 * calls by outcome for the table.
 *
 * Allowed failures are the retryable typed errors (a store that is down, a conflict, a lock, a
 * full pool), {@linkcode ALLOWED_FINAL}, and the call's own deadline. A non-retryable typed error other than those means the allocator broke
 * the worker's model (e.g. `KeyNotHeldError` for a key the worker holds) and is a violation, as is
 * anything untyped.
 *
 * @module
 */
import type { LogRecord, Op } from "../records.ts";
import { capViolations, clock, type Violation } from "./violation.ts";

/**
 * Non-retryable typed errors that a store under faults may legitimately cause: allocation that
 * spent its retries, and a corrupt entry met on the way (planted garbage; whether it cost a key for
 * good is the probe's check).
 */
export const ALLOWED_FINAL: ReadonlySet<string> = new Set([
  "AllocationFailedError",
  "CorruptEntryError",
]);

/** A period in which a worker incarnation was stopped (SIGSTOP … SIGCONT). */
export interface StopWindow {
  readonly inc: string;
  readonly from: number;
  readonly to: number;
}

/** Options of {@linkcode checkCalls}. */
export interface CallCheckOptions {
  /** Each call's deadline. */
  readonly callTimeoutMs: number;
  /** How late past its deadline a call may still end. @default {1000} */
  readonly lateMs?: number;
  /** When workers were stopped: a stopped process cannot end its calls. */
  readonly stops?: readonly StopWindow[];
  /** Violations reported per check before the rest are only counted. @default {25} */
  readonly limit?: number;
  /**
   * Non-retryable typed errors allowed besides {@linkcode ALLOWED_FINAL}: beside Cilium nodes,
   * `SplitKeyError` (a key Cilium's own re-creation split is refused, as documented; the split
   * itself is the history check's finding).
   */
  readonly alsoAllowed?: ReadonlySet<string>;
}

/** Calls of one operation by outcome. */
export interface OpOutcomes {
  ok: number;
  /** Failed calls by error name. */
  readonly errors: Map<string, number>;
}

/** What {@linkcode checkCalls} found. */
export interface CallCheckResult {
  readonly outcomes: Map<Op, OpOutcomes>;
  readonly hangs: Violation[];
  readonly errors: Violation[];
  readonly dropped: Record<string, number>;
}

/** Check name of call durations. */
export const HANG_CHECK = "every call ends within its signal";
/** Check name of error kinds. */
export const ERROR_CHECK = "only documented typed errors";

/** Runs both call checks over every record of a run. */
export function checkCalls(
  records: readonly LogRecord[],
  options: CallCheckOptions,
): CallCheckResult {
  const late = options.lateMs ?? 1000;
  const limit = options.limit ?? 25;
  const stops = new Map<string, StopWindow[]>();
  for (const s of options.stops ?? []) {
    let list = stops.get(s.inc);
    if (!list) stops.set(s.inc, list = []);
    list.push(s);
  }
  const stopped = (inc: string, from: number, to: number) => {
    let ms = 0;
    for (const s of stops.get(inc) ?? []) {
      ms += Math.max(0, Math.min(to, s.to) - Math.max(from, s.from));
    }
    return ms;
  };
  const allowedMs = (inc: string, from: number, to: number) =>
    options.callTimeoutMs + late + stopped(inc, from, to);

  const outcomes = new Map<Op, OpOutcomes>();
  const hangs: Violation[] = [];
  const errors: Violation[] = [];
  // A call reported hanging that ended later is judged by its own record.
  const ended = new Set<string>();
  for (const r of records) if (r.t === "call") ended.add(`${r.inc}|${r.op}|${r.key}|${r.start}`);
  for (const r of records) {
    if (r.t === "hang") {
      if (ended.has(`${r.inc}|${r.op}|${r.key}|${r.start}`)) continue;
      if (r.at - r.start > allowedMs(r.inc, r.start, r.at)) {
        hangs.push({
          check: HANG_CHECK,
          message: `${r.node} (${r.inc}) ${r.op} ${r.key} started ${clock(r.start)} and was ` +
            `still running ${r.at - r.start} ms later (deadline ${options.callTimeoutMs} ms)`,
          evidence: r,
        });
      }
      continue;
    }
    if (r.t !== "call") continue;
    let o = outcomes.get(r.op);
    if (!o) outcomes.set(r.op, o = { ok: 0, errors: new Map() });
    const took = r.end - r.start;
    if (took > allowedMs(r.inc, r.start, r.end)) {
      hangs.push({
        check: HANG_CHECK,
        message:
          `${r.node} (${r.inc}) ${r.op} ${r.key} took ${took} ms (deadline ${options.callTimeoutMs} ms), ` +
          `ended ${clock(r.end)}`,
        evidence: r,
      });
    }
    if (r.ok) {
      o.ok++;
      continue;
    }
    o.errors.set(r.error, (o.errors.get(r.error) ?? 0) + 1);
    const allowed = r.deadline ||
      (r.typed &&
        (r.retryable || ALLOWED_FINAL.has(r.error) || options.alsoAllowed?.has(r.error) === true));
    if (!allowed) {
      errors.push({
        check: ERROR_CHECK,
        message: `${r.node} (${r.inc}) ${r.op} ${r.key} failed with ${
          r.typed ? "non-retryable typed" : "untyped"
        } ${r.error}: ${r.message}`,
        evidence: r,
      });
    }
  }
  const dropped: Record<string, number> = {};
  return {
    outcomes,
    hangs: capViolations(hangs, limit, dropped),
    errors: capViolations(errors, limit, dropped),
    dropped,
  };
}
