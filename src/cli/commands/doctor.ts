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
 * In Cilium's double-write modes (`--identity-allocation-mode doublewrite-…`) the findings are
 * both sides' damage (each entry names its side) and the drift between the sides (an identity on
 * one side only, an ID whose label sets differ, a label set whose IDs differ:
 * `src/backends/doublewrite/doctor.ts`). `--fix` copies a one-sided identity across under the
 * other store's guards (outcome `copied`), and repairs a conflict toward the side the mode reads
 * only when the other side's entry is unused; it never changes the ID of a label set a node holds.
 * The repairs write under `--node`'s name, so a live `--node` is refused, as for `gc`.
 *
 * Exit 0 when no damage remains (none found, or all of it removed or copied), 4 when some does
 * (held by a live node, or changed meanwhile).
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
import {
  CILIUM_USE,
  DoubleWriteBackend,
  type DriftRepairer,
  isDriftKind,
} from "../../backends/doublewrite/mod.ts";
import { allocationRange, labelsCodec, requiresGlobalIdentity } from "../../identity/mod.ts";
import type { RunContext } from "../context.ts";
import type { Progress } from "../io.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import { noteIfEmpty, plural, printable, refuseLiveNode } from "./common.ts";

/** Options of `doctor`. */
export interface DoctorCommandOptions {
  /** Delete what was found (guarded: only entries unchanged since listed, never held ones). */
  readonly fix: boolean;
}

/** What became of one finding with `--fix` (`copied`: drift repaired in a double-write mode). */
export type Outcome = "removed" | "copied" | "changed meanwhile" | "held" | "kept";

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
 * is removed (drift: repaired by `repairer`) unless it changed since it was listed, or a node came
 * to hold it meanwhile.
 */
async function settle(
  doctor: StoreDoctor,
  finding: DamageFinding,
  fix: boolean,
  signal: AbortSignal,
  repairer: DriftRepairer | undefined,
): Promise<{ finding: DamageFinding; outcome: Outcome }> {
  if (finding.heldBy !== undefined) return { finding, outcome: "held" };
  if (!fix) return { finding, outcome: "kept" };
  try {
    if (repairer !== undefined && isDriftKind(finding.kind)) {
      const copied = await repairer.repair(finding, signal);
      return { finding, outcome: copied ? "copied" : "changed meanwhile" };
    }
    const removed = await doctor.removeDamage(finding, { signal });
    return { finding, outcome: removed ? "removed" : "changed meanwhile" };
  } catch (err) {
    if (!(err instanceof LiveEntryError)) throw err;
    return { finding: { ...finding, heldBy: err.holders }, outcome: "held" };
  }
}

/** What `doctor` found and did: the model its output is rendered from. */
export interface DoctorModel {
  /** Whether findings were to be removed (`--fix`). */
  readonly fix: boolean;
  /** Every finding (with its holders as last known) and what became of it, in scan order. */
  readonly results: readonly { readonly finding: DamageFinding; readonly outcome: Outcome }[];
  /** How many findings have each outcome. */
  readonly count: Readonly<Record<Outcome, number>>;
  /** Findings still in the store (all but the removed and the copied). */
  readonly remaining: number;
  /** The live nodes that hold some finding, sorted. */
  readonly holders: readonly string[];
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
  // Repairs of drift write under --node's name: a live node's lease would be taken.
  const repairs = options.fix && doctor instanceof DoubleWriteBackend;
  if (repairs) {
    const refused = await refuseLiveNode(
      ctx,
      store,
      "doctor --fix would write its repairs under its name and take its lease",
    );
    if (refused !== undefined) return refused;
  }
  const exists = await noteIfEmpty(ctx, store);
  // Reaching the store is bounded by --timeout; the scan reads the whole prefix.
  ctx.untimed();
  const progress = ctx.progress();
  await using repairer = repairs
    ? (doctor as DoubleWriteBackend).repairer({
      leaseTtlMs: ctx.options.leaseTtlMs,
    })
    : undefined;
  const results = exists ? await examine(ctx, doctor, options.fix, progress, repairer) : [];
  const model = doctorModel(results, options.fix);
  progress.done(doctorSummary(model));
  if (ctx.options.json) {
    output.out.line(JSON.stringify(doctorJson(model)));
  } else if (results.length === 0) {
    output.out.line(`no damage under prefix ${store.prefix} in ${store.where}`);
  } else {
    const { header, rows } = doctorTable(model);
    writeTable(output.out, header, rows);
    const warning = heldWarning(model);
    if (warning !== undefined) output.warn(warning);
    const hint = fixHint(model);
    if (hint !== undefined) output.err.line(hint);
  }
  return model.remaining === 0 ? ExitCode.Ok : ExitCode.Refused;
}

/**
 * Scans for damage and settles each finding. Removing one entry can expose another (Deno KV: a
 * key index whose corrupt master went is an orphan now), so `fix` scans again after a round that
 * removed something, {@linkcode FIX_ROUNDS} times at most; a finding is reported once.
 */
async function examine(
  ctx: RunContext,
  doctor: StoreDoctor,
  fix: boolean,
  progress: Progress,
  repairer: DriftRepairer | undefined,
): Promise<DoctorModel["results"]> {
  const ranges = validRanges({ min: ctx.options.min, max: ctx.options.max });
  const results: { finding: DamageFinding; outcome: Outcome }[] = [];
  const seen = new Set<string>();
  for (let round = 1; round <= (fix ? FIX_ROUNDS : 1); round++) {
    const scanned: DamageFinding[] = [];
    for await (const finding of doctor.findDamage({ ranges, signal: ctx.signal })) {
      // Held or changed entries of an earlier round are reported once.
      const id = `${finding.kind} ${finding.entry}`;
      if (seen.has(id)) continue;
      seen.add(id);
      scanned.push(finding);
      progress.update(`scanning… ${plural(results.length + scanned.length, "finding")}`);
    }
    let removed = 0;
    for (const [i, listed] of scanned.entries()) {
      const result = await settle(doctor, listed, fix, ctx.signal, repairer);
      results.push(result);
      if (result.outcome === "removed" || result.outcome === "copied") removed++;
      if (fix) progress.update(`removing… ${i + 1} of ${scanned.length}`);
    }
    if (removed === 0) break;
  }
  return results;
}

/** The model of what {@linkcode examine} returned. */
export function doctorModel(results: DoctorModel["results"], fix: boolean): DoctorModel {
  const count: Record<Outcome, number> = {
    removed: 0,
    copied: 0,
    "changed meanwhile": 0,
    held: 0,
    kept: 0,
  };
  for (const { outcome } of results) count[outcome]++;
  const holders = [...new Set(results.flatMap((r) => r.finding.heldBy ?? []))].sort();
  return {
    fix,
    results,
    count,
    remaining: results.length - count.removed - count.copied,
    holders,
  };
}

/**
 * A holder that is not a node: on a Kubernetes store, a Cilium object naming the identity, or a
 * write within Cilium's heartbeat timeout (`src/backends/k8s/users.ts`).
 */
const CILIUM_USER = /^(?:CiliumEndpoint |CiliumEndpointSlice |new or marked recently )/;

/** Whether a holder is one of Cilium's users (a double-write store names them all at once). */
function isCiliumUser(holder: string): boolean {
  return holder === CILIUM_USE || CILIUM_USER.test(holder);
}

/** The holders of `model` split into live nodes and Cilium's users. */
function holderKinds(holders: readonly string[]): { nodes: string[]; users: string[] } {
  return {
    nodes: holders.filter((h) => !isCiliumUser(h)),
    users: holders.filter(isCiliumUser),
  };
}

/** The line that ends the progress display. */
export function doctorSummary({ results, count, fix, holders }: DoctorModel): string {
  const by = holderKinds(holders).users.length > 0 ? "live nodes or Cilium" : "live nodes";
  return `found ${plural(results.length, "damaged entry", "damaged entries")}` +
    (count.held > 0 ? ` (${count.held} held by ${by})` : "") +
    (fix ? `, removed ${count.removed}` : "") +
    (count.copied > 0 ? `, copied ${count.copied} across` : "");
}

/** The `--json` output: the findings, with their outcome under `--fix`. */
export function doctorJson({ results, fix }: DoctorModel): object[] {
  return results.map(({ finding, outcome }) => ({ ...finding, ...(fix ? { outcome } : {}) }));
}

/** The table of findings (an outcome column under `--fix`, holders when some are held). */
export function doctorTable({ results, fix, count }: DoctorModel): {
  header: string[];
  rows: string[][];
} {
  const holders = count.held > 0;
  const header = [
    "KIND",
    ...(fix ? ["OUTCOME"] : []),
    "REASON",
    ...(holders ? ["HELD BY"] : []),
    "ENTRY",
  ];
  const rows = results.map(({ finding: f, outcome }) => [
    f.kind,
    ...(fix ? [outcome] : []),
    f.reason,
    ...(holders ? [f.heldBy?.join(",") ?? "-"] : []),
    printable(f.entry),
  ]);
  return { header, rows };
}

/** Why held entries stay and what to do about them (`undefined`: none is held). */
export function heldWarning({ count: { held }, holders }: DoctorModel): string | undefined {
  if (held === 0) return undefined;
  const { nodes, users } = holderKinds(holders);
  if (users.length > 0) return ciliumWarning(held, nodes);
  const them = nodes.length === 1 ? "it" : "them";
  const entries = held === 1 ? "it" : "them";
  return `${plural(held, "entry is", "entries are")} held by live ` +
    `${nodes.length === 1 ? "node" : "nodes"} ${nodes.join(", ")}, so doctor leaves ` +
    `${entries}: deleting would take an ID from under a running node, which writes its ` +
    `entries back anyway. Stop ${them} (references go with their lease) or let ${them} ` +
    `repair ${entries} (a node holding a key rewrites its corrupt master at its next sync), ` +
    "then run 'idalloc doctor' again";
}

/**
 * Why entries that Cilium uses (and maybe live nodes) stay: an identity an endpoint names, or one
 * created or marked within the heartbeat timeout (an agent may be about to name it), is in use by pods.
 */
function ciliumWarning(held: number, nodes: readonly string[]): string {
  const entries = held === 1 ? "it" : "them";
  return `${plural(held, "entry is", "entries are")} in use by Cilium` +
    (nodes.length === 0 ? "" : ` or held by live nodes ${nodes.join(", ")}`) +
    ` (see HELD BY), so doctor leaves ${entries}: a CiliumEndpoint or CiliumEndpointSlice names ` +
    "the identity, or it was created or marked less than Cilium's heartbeat timeout ago (an agent may be " +
    "about to name it), and deleting it would take the identity from under running pods. Once " +
    "no endpoint names it and the timeout (--heartbeat-timeout) has passed, run 'idalloc doctor' " +
    "again";
}

/** The hint to run `doctor --fix` (`undefined` with `--fix`, or when nothing could go). */
export function fixHint(
  { fix, results, count: { kept: fixable, held } }: DoctorModel,
): string | undefined {
  if (fix || fixable === 0) return undefined;
  // Drift is repaired by copying across (double-write modes), other damage by deleting.
  const drift = results.some((r) => r.outcome === "kept" && isDriftKind(r.finding.kind));
  return `run 'idalloc doctor --fix' to ${drift ? "repair" : "delete"} ${
    fixable === 1 ? "this entry" : `these ${fixable} entries`
  }${held === 0 ? "" : held === 1 ? " (not the held one)" : " (not the held ones)"}`;
}
