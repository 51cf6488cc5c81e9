/**
 * The tables a nemesis run prints: faults injected by kind, calls by outcome, checks passed,
 * recovery after each store outage, and the first violations with their evidence files.
 *
 * @module
 */
import { writeTable } from "../src/cli/table.ts";
import type { Sink } from "../src/cli/io.ts";
import type { BackendReport } from "./run.ts";
import { clock } from "./checks/violation.ts";
import type { BackendRun } from "./config.ts";
import { ATTRIBUTION_CLASSES, type AttributionSummary } from "./checks/attribution.ts";

/** Violations printed per run; the rest are in the run's `report.json`. */
const SHOWN = 12;

/** What the header of a backend's report says about the run as it was planned. */
export interface RunPlan {
  /** Its share of `--seconds` and its fault phase. */
  readonly run: BackendRun;
  /** The faults it injects, as a list for people (only this backend's). */
  readonly faults: string;
}

/** Writes the report of one backend run. */
export function writeReport(sink: Sink, r: BackendReport, plan: RunPlan, command: string): void {
  const failed = [...r.checks.values()].reduce((n, c) => n + c.failed, 0);
  const took = Math.round(r.durationMs / 1_000);
  // A busy machine can stretch the parts around the fault phase past their estimate, and the
  // first round of faults runs to its end however short the phase: say so.
  const over = took > plan.run.seconds
    ? ` (over its ${plan.run.seconds} s: a busy machine, or a short run trying every fault once)`
    : "";
  sink.line(
    `== nemesis ${r.backend}: seed ${r.seed}, ${took} s in all${over}, ${r.seconds} s of faults, ` +
      `${r.workers.plain} allocator + ${r.workers.identity} identity workers${
        r.workers.cilium > 0
          ? ` + ${r.workers.cilium} Cilium v1.16 nodes${
            r.crd ? " (CRD mode) + its operator GC" : ""
          }`
          : ""
      }`,
  );
  sink.line(`   faults: ${plan.faults}`);
  if (r.configurations) {
    // A migration step: which incarnations ran in which configuration.
    const by = Object.entries(r.configurations).map(([label, incs]) =>
      `${label} ${incs.length} (${incs.join(", ")})`
    );
    sink.line(`   nodes by configuration: ${by.join("; ")}`);
  }
  sink.line(`   reproduce: ${command}`);
  sink.line();

  const byLabel = new Map<string, { n: number; failed: number }>();
  for (const f of r.faults) {
    const row = byLabel.get(f.label) ?? { n: 0, failed: 0 };
    row.n++;
    if (f.error) row.failed++;
    byLabel.set(f.label, row);
  }
  writeTable(
    sink,
    ["fault", "injected", "not applied"],
    [...byLabel].sort(([a], [b]) => a.localeCompare(b)).map((
      [label, { n, failed }],
    ) => [label, String(n), failed ? String(failed) : ""]),
  );
  sink.line();

  const rows: string[][] = [];
  for (const [op, o] of [...r.outcomes].sort(([a], [b]) => a.localeCompare(b))) {
    let failedCalls = 0;
    for (const n of o.errors.values()) failedCalls += n;
    const errors = [...o.errors].sort((a, b) => b[1] - a[1]).map(([name, n]) => `${name} ${n}`);
    rows.push([op, String(o.ok), String(failedCalls), errors.join(", ")]);
  }
  writeTable(sink, ["call", "ok", "failed", "failures by error"], rows);
  sink.line();

  writeTable(
    sink,
    ["check", "result", "note"],
    [...r.checks].map(([name, c]) => [name, c.failed === 0 ? "ok" : `FAIL (${c.failed})`, c.note]),
  );
  sink.line();

  if (r.attribution) writeAttribution(sink, r.attribution);
  if (r.crd) writeCrd(sink, r.crd);
  if (r.recoveries.length > 0) {
    writeTable(
      sink,
      ["store fault", "back at", "first allocate after"],
      r.recoveries.map((x) => [
        x.label,
        clock(x.backAt),
        x.ms === undefined ? "none" : `${x.ms} ms`,
      ]),
    );
    sink.line();
  }
  for (const h of r.harness) sink.line(`harness: ${h}`);
  if (failed > 0) {
    sink.line(`${failed} violation(s); the first ${Math.min(SHOWN, r.violations.length)}:`);
    for (const v of r.violations.slice(0, SHOWN)) sink.line(`  [${v.check}] ${v.message}`);
    sink.line(`every violation with its evidence: ${r.dir}/report.json`);
    sink.line();
  }
}

/** Whether a run had no violation. */
export function clean(r: BackendReport): boolean {
  return [...r.checks.values()].every((c) => c.failed === 0);
}

/** Evidence lines printed per class; every one is in `report.json`. */
const SHOWN_PER_CLASS = 8;

/**
 * Beside Cilium nodes: the violations (history, store, probe) by whose they are, with their
 * evidence, and how often idalloc refused a split key.
 */
export function writeAttribution(sink: Sink, a: AttributionSummary): void {
  writeTable(
    sink,
    ["violations by side (beside Cilium)", "count"],
    ATTRIBUTION_CLASSES.map((c) => [c, String(a.counts[c])]),
  );
  const s = a.splitRefusals;
  sink.line(
    s.calls === 0
      ? "SplitKeyError refusals: none"
      : `SplitKeyError refusals: ${s.calls} calls on ${s.keys} key(s), the longest from first to ` +
        `last refusal ${s.longestMs} ms`,
  );
  if (a.storeChanges === 0) {
    sink.line("store record: none (the evidence from the store is missing)");
  }
  for (const c of ATTRIBUTION_CLASSES) {
    const list = a.attributions.filter((x) => x.class === c);
    for (const x of list.slice(0, SHOWN_PER_CLASS)) sink.line(`  ${x.line}`);
    if (list.length > SHOWN_PER_CLASS) {
      sink.line(`  … ${list.length - SHOWN_PER_CLASS} more ${c} (report.json)`);
    }
  }
  sink.line();
}

/** Beside Cilium CRD-mode nodes: deletions by deleter, the operator, and Cilium's duplicates. */
export function writeCrd(sink: Sink, c: NonNullable<BackendReport["crd"]>): void {
  const d = c.deletions;
  sink.line(
    `identities deleted: ${d.deletions} (idalloc GC ${d.byDeleter["idalloc GC"]}, Cilium ` +
      `operator ${d.byDeleter["Cilium operator"]}); held or endpoint-named among those inferred ` +
      `across a gap of the record (uncertain, not counted): ${d.uncertain.length}; raced a join ` +
      `under way (the joiner's reference written after the deleting pass's reads, the identity ` +
      `never answered; refs.ts case 2, not counted): ${d.raced.length}` +
      (d.raced.length > 0
        ? ` (${d.raced.slice(0, 5).map((r) => `${r.id} by ${r.joinedBy.join("+")}`).join(", ")})`
        : ""),
  );
  sink.line(
    `Cilium operator GC: ${c.operator.starts} start(s), ${c.operator.exitsOnItsOwn} exit(s) on ` +
      "its own (an API error), each restarted",
  );
  const a = c.activity;
  sink.line(
    `duplicates created: ${a.created.total} on ${a.created.keys} key(s) (by Cilium ` +
      `${a.created.byCilium}, by idalloc ${a.created.byIdalloc}, writer unknown ` +
      `${a.created.unknown}); answers while a key had several identities: Cilium ` +
      `${a.answered.cilium.whileDuplicated} (${a.answered.cilium.notOldest} not the oldest), ` +
      `idalloc ${a.answered.idalloc.whileDuplicated} (${a.answered.idalloc.notOldest} not the oldest)`,
  );
  sink.line();
}
