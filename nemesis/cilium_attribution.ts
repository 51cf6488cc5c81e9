/**
 * The verdicts beside Cilium nodes: every violation of the history, of the store at the end of
 * the run and of the probe is attributed (`checks/attribution.ts`) from the store's record of
 * the run (`store.jsonl`), and only idalloc's count as failed checks; Cilium's own (Cilium-only,
 * and mixed ones inherited from the Cilium side) are reported with their evidence but fail
 * nothing.
 *
 * @module
 */
import {
  attribute,
  type AttributionInput,
  type AttributionSummary,
  IDALLOC_CLASSES,
} from "./checks/attribution.ts";
import type { StopWindow } from "./checks/calls.ts";
import {
  type KeyLookup,
  type StoreChange,
  storeChangeSchema,
  StoreHistory,
} from "./checks/store_history.ts";
import { capViolations, type Violation } from "./checks/violation.ts";
import type { FaultRecord } from "./faults.ts";
import type { LogRecord } from "./records.ts";

/** What {@linkcode attributeRun} needs of the run. */
export interface RunAttributionInput {
  /**
   * The history check's violations (overlaps and splits, uncapped), and the store checks' and
   * the probe's (named in `checks`); any other is charged to idalloc as it is.
   */
  readonly violations: readonly Violation[];
  /** Check names of the store checks and the probe. */
  readonly checks: AttributionInput["checks"];
  /** The store's record (`store.jsonl`); absent when the store kept none. */
  readonly storeLogPath?: string;
  readonly ciliumIncs: ReadonlySet<string>;
  readonly ciliumNodes: ReadonlySet<string>;
  readonly faults: readonly FaultRecord[];
  readonly stops: readonly StopWindow[];
  /** idalloc's and Cilium's records together. */
  readonly records: readonly LogRecord[];
  readonly leaseTtlMs: number;
  /** Which master of a key Cilium's lookup gives (see `AttributionInput.keyLookup`). */
  readonly keyLookup?: KeyLookup;
  /** Violations reported per check before the rest are only counted. */
  readonly limit: number;
}

/** The attribution, and the violations charged to idalloc (capped per check). */
export interface RunAttribution {
  readonly summary: AttributionSummary;
  readonly charged: Violation[];
  readonly dropped: Record<string, number>;
  /** Lines of the record that did not parse (a harness problem). */
  readonly bad: string[];
}

/** The store's record at `path` (none: empty), and the lines that did not parse. */
export async function readStoreLog(
  path: string | undefined,
): Promise<{ changes: StoreChange[]; bad: string[] }> {
  const changes: StoreChange[] = [];
  const bad: string[] = [];
  if (path) {
    const text = await Deno.readTextFile(path).catch(() => "");
    for (const line of text.split("\n")) {
      if (line.trim() === "") continue;
      try {
        changes.push(storeChangeSchema.parse(JSON.parse(line)));
      } catch (err) {
        bad.push(`${line.slice(0, 200)} (${String(err).slice(0, 200)})`);
      }
    }
  }
  return { changes, bad };
}

/** Reads the store's record and attributes every violation (see the module doc). */
export async function attributeRun(input: RunAttributionInput): Promise<RunAttribution> {
  const { changes, bad } = await readStoreLog(input.storeLogPath);
  const summary = attribute(input.violations, {
    ciliumIncs: input.ciliumIncs,
    ciliumNodes: input.ciliumNodes,
    store: new StoreHistory(changes),
    faults: input.faults,
    stops: input.stops,
    records: input.records,
    leaseTtlMs: input.leaseTtlMs,
    checks: input.checks,
    keyLookup: input.keyLookup,
  });
  const cilium = new Set(
    summary.attributions.filter((a) => !IDALLOC_CLASSES.has(a.class)).map((a) => a.violation),
  );
  const dropped: Record<string, number> = {};
  const byCheck = new Map<string, Violation[]>();
  for (const v of input.violations) {
    if (cilium.has(v)) continue;
    let list = byCheck.get(v.check);
    if (!list) byCheck.set(v.check, list = []);
    list.push(v);
  }
  const charged = [...byCheck.values()].flatMap((list) =>
    capViolations(list, input.limit, dropped)
  );
  return { summary, charged, dropped, bad };
}
