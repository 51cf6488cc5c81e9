/**
 * `doctor [--fix]`: lists the entries under the prefix that idalloc cannot use — written by hand,
 * by a broken tool, by an attacker: masters with a non-numeric ID or an unreadable or oversized
 * value, references that name no ID, one outside `[--min, --max]` or (etcd) sit on no lease,
 * counters of the wrong type and unreadable indexes (Deno KV). Nothing of this stops idalloc (GC
 * and watches skip it), but it should go. `--fix` deletes each finding with a guarded delete: only
 * if the entry is unchanged since it was listed, so one repaired or rewritten meanwhile stays.
 *
 * Exit 0 when no damage remains (none found, or all of it removed), 4 when some does.
 *
 * @module
 */
import { type DamageFinding, isStoreDoctor } from "../../allocator/damage.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import { noteIfEmpty, plural, printable } from "./common.ts";

/** Options of `doctor`. */
export interface DoctorCommandOptions {
  /** Delete what was found (guarded: only entries unchanged since listed). */
  readonly fix: boolean;
}

/** What became of one finding with `--fix`. */
type Outcome = "removed" | "changed meanwhile" | "kept";

/** `doctor [--fix]`. */
export async function doctorCommand(
  ctx: RunContext,
  options: DoctorCommandOptions,
): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store();
  const doctor = store.backend;
  if (!isStoreDoctor(doctor)) {
    throw new InvalidOptionsError(`the ${store.kind} backend cannot report damage`);
  }
  const exists = await noteIfEmpty(ctx, store);
  // Reaching the store is bounded by --timeout; the scan reads the whole prefix.
  ctx.untimed();
  const progress = ctx.progress();
  const range = { min: ctx.options.min, max: ctx.options.max };
  const found: DamageFinding[] = [];
  if (exists) {
    for await (const finding of doctor.findDamage({ range, signal: ctx.signal })) {
      found.push(finding);
      progress.update(`scanning… ${plural(found.length, "finding")}`);
    }
  }
  const outcomes: Outcome[] = [];
  for (const finding of found) {
    if (!options.fix) {
      outcomes.push("kept");
      continue;
    }
    const removed = await doctor.removeDamage(finding, { signal: ctx.signal });
    outcomes.push(removed ? "removed" : "changed meanwhile");
    progress.update(`removing… ${outcomes.length} of ${found.length}`);
  }
  const remaining = outcomes.filter((o) => o !== "removed").length;
  progress.done(
    `found ${plural(found.length, "damaged entry", "damaged entries")}` +
      (options.fix ? `, removed ${found.length - remaining}` : ""),
  );
  if (ctx.options.json) {
    output.out.line(JSON.stringify(
      found.map((f, i) => ({ ...f, ...(options.fix ? { outcome: outcomes[i] } : {}) })),
    ));
  } else if (found.length === 0) {
    output.out.line(`no damage under prefix ${store.prefix} in ${store.where}`);
  } else {
    writeTable(
      output.out,
      ["KIND", ...(options.fix ? ["OUTCOME"] : []), "REASON", "ENTRY"],
      found.map((f, i) => [
        f.kind,
        ...(options.fix ? [outcomes[i]] : []),
        f.reason,
        printable(f.entry),
      ]),
    );
    if (!options.fix) output.err.line("run 'idalloc doctor --fix' to delete these entries");
  }
  return remaining === 0 ? ExitCode.Ok : ExitCode.Refused;
}
