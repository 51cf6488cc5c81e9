/**
 * `doctor [--fix]`: lists the entries under the prefix that idalloc cannot use — written by hand,
 * by a broken tool, by an attacker: masters with a non-numeric ID or an unreadable or oversized
 * value, references that name no ID, one outside every valid range or (etcd) sit on no lease,
 * counters of the wrong type and unreadable or orphaned indexes (Deno KV). Nothing of this stops
 * idalloc (GC and watches skip it), but it should go.
 *
 * Valid ranges: `[--min, --max]`, and for a key that is a Cilium label set (an identity) every
 * cluster's identity range too, since one prefix holds the identities of every cluster that
 * allocates there (`identity allocate --cluster-id 3` allocates in `[196608, 262143]`).
 *
 * `--fix` deletes each finding with a guarded delete: only if the entry is unchanged since it was
 * listed, so one repaired or rewritten meanwhile stays, and never one that a live node holds
 * (bound to a live etcd lease, a Deno KV reference of a live node, or an entry of an ID or key
 * that live references name): such an entry is shown with its holders and what to do instead.
 *
 * Exit 0 when no damage remains (none found, or all of it removed), 4 when some does (held by a
 * live node, or changed meanwhile).
 *
 * @module
 */
import type { IdRange } from "../../allocator/backend.ts";
import {
  type DamageFinding,
  isStoreDoctor,
  mergeRanges,
  type StoreDoctor,
  type ValidRanges,
} from "../../allocator/damage.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import { allocationRange, labelsCodec, requiresGlobalIdentity } from "../../identity/mod.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import { noteIfEmpty, plural, printable } from "./common.ts";

/** Options of `doctor`. */
export interface DoctorCommandOptions {
  /** Delete what was found (guarded: only entries unchanged since listed, never held ones). */
  readonly fix: boolean;
}

/** What became of one finding with `--fix`. */
type Outcome = "removed" | "changed meanwhile" | "held" | "kept";

/**
 * Every cluster's global identity range, joined (with 255 and with 511 clusters: the bits of the
 * cluster ID move, the union does not): where an identity of any cluster of a mesh may be stored.
 */
export const IDENTITY_RANGES: readonly IdRange[] = mergeRanges(
  ([255, 511] as const).flatMap((max) =>
    Array.from({ length: max + 1 }, (_, cluster) => allocationRange(cluster, max))
  ),
);

/** Whether the encoded `key` is a label set that gets a global identity from the store. */
function isIdentityKey(key: string): boolean {
  try {
    const labels = labelsCodec.decode(key);
    return labels.size > 0 && requiresGlobalIdentity(labels);
  } catch {
    return false;
  }
}

/**
 * The ranges a stored ID of `key` may validly be in: the allocator's `[min, max]`, and for an
 * identity's key every cluster's identity range as well.
 */
export function validRanges(range: IdRange): ValidRanges {
  const own = [range];
  const identity = mergeRanges([range, ...IDENTITY_RANGES]);
  return (key) => isIdentityKey(key) ? identity : own;
}

/** Scans `doctor --fix` makes at most (see {@linkcode doctorCommand}). */
const FIX_ROUNDS = 3;

/**
 * What becomes of one finding: a held one is kept (and so is every one without `--fix`); else it
 * is removed unless it changed since it was listed, or a node came to hold it meanwhile.
 */
async function settle(
  doctor: StoreDoctor,
  finding: DamageFinding,
  fix: boolean,
  signal: AbortSignal,
): Promise<{ finding: DamageFinding; outcome: Outcome }> {
  if (finding.heldBy !== undefined) return { finding, outcome: "held" };
  if (!fix) return { finding, outcome: "kept" };
  try {
    const removed = await doctor.removeDamage(finding, { signal });
    return { finding, outcome: removed ? "removed" : "changed meanwhile" };
  } catch (err) {
    if (!(err instanceof LiveEntryError)) throw err;
    return { finding: { ...finding, heldBy: err.holders }, outcome: "held" };
  }
}

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
  const ranges = validRanges({ min: ctx.options.min, max: ctx.options.max });
  const found: DamageFinding[] = [];
  const outcomes: Outcome[] = [];
  const seen = new Set<string>();
  // Removing one entry can expose another (Deno KV: a key index whose corrupt master went is an
  // orphan now), so --fix scans again after a round that removed something, a few times at most.
  for (let round = 1; exists && round <= (options.fix ? FIX_ROUNDS : 1); round++) {
    const scanned: DamageFinding[] = [];
    for await (const finding of doctor.findDamage({ ranges, signal: ctx.signal })) {
      // Held or changed entries of an earlier round are reported once.
      const id = `${finding.kind} ${finding.entry}`;
      if (seen.has(id)) continue;
      seen.add(id);
      scanned.push(finding);
      progress.update(`scanning… ${plural(found.length + scanned.length, "finding")}`);
    }
    let removed = 0;
    for (const [i, listed] of scanned.entries()) {
      const { finding, outcome } = await settle(doctor, listed, options.fix, ctx.signal);
      found.push(finding);
      outcomes.push(outcome);
      if (outcome === "removed") removed++;
      if (options.fix) progress.update(`removing… ${i + 1} of ${scanned.length}`);
    }
    if (removed === 0) break;
  }
  const count = (o: Outcome) => outcomes.filter((x) => x === o).length;
  const held = count("held");
  const remaining = outcomes.length - count("removed");
  progress.done(
    `found ${plural(found.length, "damaged entry", "damaged entries")}` +
      (held > 0 ? ` (${held} held by live nodes)` : "") +
      (options.fix ? `, removed ${count("removed")}` : ""),
  );
  if (ctx.options.json) {
    output.out.line(JSON.stringify(
      found.map((f, i) => ({
        ...f,
        ...(options.fix ? { outcome: outcomes[i] } : {}),
      })),
    ));
  } else if (found.length === 0) {
    output.out.line(`no damage under prefix ${store.prefix} in ${store.where}`);
  } else {
    const holders = held > 0;
    writeTable(
      output.out,
      [
        "KIND",
        ...(options.fix ? ["OUTCOME"] : []),
        "REASON",
        ...(holders ? ["HELD BY"] : []),
        "ENTRY",
      ],
      found.map((f, i) => [
        f.kind,
        ...(options.fix ? [outcomes[i]] : []),
        f.reason,
        ...(holders ? [f.heldBy?.join(",") ?? "-"] : []),
        printable(f.entry),
      ]),
    );
  }
  if (!ctx.options.json && held > 0) {
    const nodes = [...new Set(found.flatMap((f) => f.heldBy ?? []))].sort();
    const them = nodes.length === 1 ? "it" : "them";
    const entries = held === 1 ? "it" : "them";
    output.warn(
      `${plural(held, "entry is", "entries are")} held by live ` +
        `${nodes.length === 1 ? "node" : "nodes"} ${nodes.join(", ")}, so doctor leaves ` +
        `${entries}: deleting would take an ID from under a running node, which writes its ` +
        `entries back anyway. Stop ${them} (references go with their lease) or let ${them} ` +
        `repair ${entries} (a node holding a key rewrites its corrupt master at its next sync), ` +
        "then run 'idalloc doctor' again",
    );
  }
  const fixable = count("kept");
  if (!ctx.options.json && !options.fix && fixable > 0) {
    output.err.line(
      `run 'idalloc doctor --fix' to delete ${
        fixable === 1 ? "this entry" : `these ${fixable} entries`
      }${held === 0 ? "" : held === 1 ? " (not the held one)" : " (not the held ones)"}`,
    );
  }
  return remaining === 0 ? ExitCode.Ok : ExitCode.Refused;
}
