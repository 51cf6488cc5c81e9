/**
 * `gc`: collects IDs that no node uses, by Cilium's two-round marking: a pass marks the unused
 * IDs, the next pass deletes those still unused and unchanged (every delete is a guarded write
 * that fails if a node referenced the key meanwhile). One run makes two passes `--grace` apart;
 * `--every 15m` keeps running, one pass per interval, like Cilium's operator. Either is at least
 * `--lease-ttl` unless `--force` (see `passGapMs`).
 *
 * Only IDs in `[--min, --max]` are considered, and only IDs no live reference names are deleted. A
 * `--node` whose lease is live is refused (exit 4): the run would take that node's lease.
 *
 * A store with a grace of its own (Kubernetes: Cilium operator's `--heartbeat-timeout`, 30 min)
 * keeps it unless `--grace` is given: an identity created or marked less than that ago stays (and
 * one a `CiliumEndpoint` or `CiliumEndpointSlice` names, always). One run then marks what is
 * unused, and a run at least that much later (or `--every`) deletes it; the run says so.
 *
 * @module
 */
import { Allocator } from "../../allocator/allocator.ts";
import type { GcStats } from "../../allocator/types.ts";
import { formatDuration } from "../args.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { InvalidOptionsError } from "../../errors.ts";
import {
  allocatorOptions,
  pause,
  plural,
  printable,
  refuseLiveNode,
  requireNamespace,
} from "./common.ts";

/** Options of `gc`. */
export interface GcCommandOptions {
  /** Run forever, one pass per this many ms. */
  readonly everyMs?: number;
  /** Time between the two passes of a single run, in ms (default: `--lease-ttl`). */
  readonly graceMs?: number;
  /** Allow passes closer together than `--lease-ttl`. */
  readonly force: boolean;
}

/**
 * The time between passes, at least the lease TTL unless `--force`: a holder whose lease vanished
 * without its knowing (revoked; on Deno KV its lease record replaced) answers its IDs from memory
 * until its own lease deadline, at most one TTL later. Passes closer than that could give such an
 * ID to another key while the holder still uses it (the library's `gcGraceMs` protects the same
 * way).
 */
function passGapMs(ctx: RunContext, options: GcCommandOptions): number {
  const ttl = ctx.options.leaseTtlMs;
  const [flag, ms] = options.everyMs !== undefined
    ? ["--every", options.everyMs]
    : ["--grace", options.graceMs ?? ttl];
  if (ms < ttl && !options.force) {
    throw new InvalidOptionsError(
      `invalid option: ${flag} ${formatDuration(ms)} is shorter than the lease TTL ` +
        `(--lease-ttl ${formatDuration(ttl)}): gc deletes an ID only after it was unused that ` +
        "long, so that a node whose lease vanished without its knowing stops using the ID " +
        `before it can go to another key; give ${flag} ${formatDuration(ttl)} or more (and ` +
        "--lease-ttl the longest lease TTL of your nodes), or --force when no node can be in " +
        "that state (all stopped, a test)",
    );
  }
  return ms;
}

/** How often the "pass running" progress line is refreshed. */
const TICK_MS = 1_000;

/** `gc [--every <duration>] [--grace <duration>]`. */
export async function gcCommand(ctx: RunContext, options: GcCommandOptions): Promise<number> {
  const { output } = ctx;
  const gapMs = passGapMs(ctx, options);
  const store = await ctx.store();
  await requireNamespace(ctx, store);
  // A run under a live node's name would take its lease (Deno KV: its references die with it)
  // and could then collect the very IDs that node uses.
  const refused = await refuseLiveNode(
    ctx,
    store,
    "gc would run under its name and could collect the IDs it uses",
  );
  if (refused !== undefined) return refused;
  // The operator paces the passes (two --grace apart, or one per --every): that gap is the grace
  // (the allocator's default, a lease TTL, is for passes a caller does not pace this way).
  // A store's own grace (Kubernetes: Cilium's heartbeat timeout) holds unless --grace is given.
  const storeGraceMs = options.graceMs === undefined ? store.backend.defaultGcGraceMs : undefined;
  await using allocator = await Allocator.open(store.backend, {
    ...allocatorOptions(ctx),
    gcGraceMs: storeGraceMs ?? gapMs,
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
          ? `: two passes ${formatDuration(gapMs)} apart`
          : `: one pass every ${formatDuration(gapMs)} until Ctrl-C`),
    );
    if (storeGraceMs !== undefined && storeGraceMs > gapMs) {
      output.err.line(
        `note: this store keeps an ID created or marked less than ` +
          `${formatDuration(storeGraceMs)} ago (on Kubernetes, as Cilium's operator: ` +
          "--heartbeat-timeout), so a run at least that much later deletes what this one marks " +
          "(or use --every; --grace overrides it)",
      );
    }
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
    await pause(gapMs, ctx.interrupt);
    if (ctx.interrupt.aborted) break;
  }
  if (!ctx.options.json) output.err.line(`gc: ${plural(total, "ID")} deleted`);
  return ExitCode.Ok;
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
