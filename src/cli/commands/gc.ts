/**
 * `gc`: collects IDs that no node uses, by Cilium's two-round marking: a pass marks the unused
 * IDs, the next pass deletes those still unused and unchanged (every delete is a guarded write
 * that fails if a node referenced the key meanwhile). One run makes two passes `--grace` apart;
 * `--every 15m` keeps running, one pass per interval, like Cilium's operator.
 *
 * Only IDs in `[--min, --max]` are considered, and only IDs no live reference names are deleted. A
 * `--node` that names a live node is refused (exit 4): the run would take that node's lease.
 *
 * @module
 */
import { Allocator } from "../../allocator/allocator.ts";
import type { GcStats } from "../../allocator/types.ts";
import { formatDuration } from "../args.ts";
import type { RunContext } from "../context.ts";
import { errorLine, ExitCode } from "../exit.ts";
import type { Store } from "../store.ts";
import { allocatorOptions, pause, plural, printable, requireNamespace } from "./common.ts";

/** Options of `gc`. */
export interface GcCommandOptions {
  /** Run forever, one pass per this many ms. */
  readonly everyMs?: number;
  /** Time between the two passes of a single run, in ms. */
  readonly graceMs: number;
}

/** How often the "pass running" progress line is refreshed. */
const TICK_MS = 1_000;

/** `gc [--every <duration>] [--grace <duration>]`. */
export async function gcCommand(ctx: RunContext, options: GcCommandOptions): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store();
  await requireNamespace(ctx, store);
  const holder = await liveNodeNamed(ctx, store);
  if (holder !== undefined) {
    // A run under a live node's name would take its lease (Deno KV: its references die with it)
    // and could then collect the very IDs that node uses.
    const what = `--node ${holder} names a live node: gc would run under its name and could ` +
      "collect the IDs it uses; give gc a name of its own (or none)";
    output.err.line(errorLine(ctx.options.json, ExitCode.Refused, "LiveEntryError", what));
    return ExitCode.Refused;
  }
  // The operator paces the passes (two --grace apart, or one per --every): that gap is the grace
  // (the allocator's default, a lease TTL, is for passes a caller does not pace this way).
  const grace = { gcGraceMs: options.everyMs ?? options.graceMs };
  await using allocator = await Allocator.open(store.backend, {
    ...allocatorOptions(ctx),
    ...grace,
  }, {
    signal: ctx.signal,
  });
  await allocator.waitForInitialSync({ signal: ctx.signal });
  // Reaching the store is bounded by --timeout; the passes themselves take as long as they take
  // (a pass reads every reference in range) and end early only when interrupted.
  ctx.untimed();
  const { min, max } = ctx.options;
  if (!ctx.options.json) {
    output.err.line(
      `gc over IDs [${min}, ${max}] under prefix ${store.prefix} in ${store.where}` +
        (options.everyMs === undefined
          ? `: two passes ${formatDuration(options.graceMs)} apart`
          : `: one pass every ${formatDuration(options.everyMs)} until Ctrl-C`),
    );
  }
  const progress = ctx.progress();
  let total = 0;
  for (let pass = 1;; pass++) {
    // The cache knows every key now; after the pass the deleted IDs may be gone from it.
    const keys = new Map(allocator.entries());
    const started = Date.now();
    const ticker = setInterval(
      () => progress.update(`gc pass ${pass}… ${Math.round((Date.now() - started) / 1000)}s`),
      TICK_MS,
    );
    let stats: GcStats;
    try {
      stats = await allocator.runGc({ signal: ctx.interrupt });
    } catch (err) {
      // Interrupted in the middle of a pass: what was deleted so far stays deleted, and that is
      // all right (each delete was guarded); stop quietly.
      if (ctx.interrupt.aborted) break;
      throw err;
    } finally {
      clearInterval(ticker);
      progress.clear();
    }
    total += stats.deleted;
    report(ctx, pass, stats, keys);
    await output.flush();
    if (options.everyMs === undefined && pass >= 2) break;
    await pause(options.everyMs ?? options.graceMs, ctx.interrupt);
    if (ctx.interrupt.aborted) break;
  }
  if (!ctx.options.json) output.err.line(`gc: ${plural(total, "ID")} deleted`);
  return ExitCode.Ok;
}

/** The `--node` name, if one was given and a live node holds a lease under it. */
async function liveNodeNamed(ctx: RunContext, store: Store): Promise<string | undefined> {
  if (!ctx.options.nodeGiven) return undefined;
  const leases = await store.admin.nodeLeases(ctx.signal);
  return leases.some((l) => l.node === ctx.options.node && l.live) ? ctx.options.node : undefined;
}

function report(ctx: RunContext, pass: number, stats: GcStats, keys: Map<number, string>): void {
  const deleted = stats.deletedIds.map((id) => ({ id, key: keys.get(id) ?? null }));
  if (ctx.options.json) {
    ctx.output.out.line(JSON.stringify({
      pass,
      alive: stats.alive,
      marked: stats.marked,
      deleted,
    }));
    return;
  }
  ctx.output.out.line(
    `pass ${pass}: ${stats.deleted} deleted, ${stats.marked} unused (marked), ` +
      `${stats.alive} remain`,
  );
  for (const { id, key } of deleted) {
    ctx.output.out.line(`  deleted ID ${id}  ${key === null ? "(key unknown)" : printable(key)}`);
  }
}
