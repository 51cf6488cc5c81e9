/**
 * The nemesis: injects faults, chosen by the seed, until the fault phase ends. The first round
 * tries every enabled kind once, each garbage kind included, in a seeded shuffled order, and runs
 * to its end even past the fault phase: a short run still tries every kind (and takes longer than
 * asked). Then the enabled kinds are visited round after round, garbage kinds in turn. Each fault
 * is recorded with its start, end and, for store outages, the instant the store was back (for the
 * recovery time).
 *
 * The nemesis injects its own kinds (`NEMESIS_FAULTS`: on a worker, its lease, or garbage); the
 * store's own (etcd's members killed, compacted, cut off) its backend's run store injects.
 *
 * By default one fault runs at a time, with a pause of 1–3 s after each. With `overlapEveryMs`, a
 * fault starts every so often whether the others have ended or not (a stall of one worker while
 * another is killed or revoked): each worker and the store take one fault at a time.
 *
 * @module
 */
import { sleep } from "../src/abort.ts";
import type {
  GarbageTargets,
  NemesisFault,
  NemesisRunStore,
  NemesisTimings,
} from "../src/testing/nemesis.ts";
import { between, shuffle } from "../src/testing/prng.ts";
import type { StopWindow } from "./checks/calls.ts";

/**
 * The table's row of each of the nemesis's own kinds (refined further by some faults, e.g.
 * `kill (new name)`); a store fault's row is its backend's label.
 */
export const FAULT_LABELS: Readonly<Record<NemesisFault, string>> = {
  "kill": "kill",
  "stall": "stall",
  "lease-revoke": "lease revoke",
  "garbage": "garbage",
};

/** One injected fault. */
export interface FaultRecord {
  readonly kind: string;
  /** The table's row: the kind, refined (`kill (new name)`, `garbage/empty-master`). */
  readonly label: string;
  readonly start: number;
  readonly end: number;
  /** What exactly was done. */
  readonly detail: string;
  /** For store faults: when every member was healthy again. */
  readonly backAt?: number;
  /** For faults that failed to apply (e.g. nothing to revoke). */
  readonly error?: string;
  /** Masters planted as garbage that parse as valid ones. */
  readonly plantedMasters?: readonly number[];
  /** The node incarnation a node fault hit (a kill: the one killed). */
  readonly inc?: string;
  /** The incarnation a killed node was restarted as. */
  readonly restartedAs?: string;
}

/** A worker slot as the nemesis needs it. */
export interface FaultTarget {
  /** The worker's current node name. */
  readonly node: string;
  /** The current incarnation. */
  readonly inc: string;
  signal(signal: "SIGKILL" | "SIGSTOP" | "SIGCONT"): boolean;
}

/** What the nemesis acts on. */
export interface FaultContext {
  readonly random: () => number;
  readonly store: NemesisRunStore;
  /** The store's own faults the run injects (its backend's `storeFaults`): kind → label. */
  readonly storeFaults: Readonly<Record<string, string>>;
  readonly timings: NemesisTimings;
  /** Clock slack the workers' backends allow a lease (the store's `skewMs`). */
  readonly skewMs: number;
  readonly garbage: readonly string[];
  readonly garbageTargets: GarbageTargets;
  /** Number of worker slots. */
  readonly slots: number;
  target(slot: number): FaultTarget;
  /** SIGKILLs the slot's worker and starts a new incarnation, under a new name if `rename`. */
  restart(slot: number, rename: boolean): Promise<FaultTarget>;
  /** Called as faults end. */
  record(fault: FaultRecord): void;
  /** Called as a fault starts (a fault that never ends is otherwise nowhere). */
  begin?(kind: string, start: number): void;
  /** Called when a worker is stopped and continued. */
  stopped(window: StopWindow): void;
  /** Start a fault every `[min, max]` ms, overlapping those still running (see the module doc). */
  readonly overlapEveryMs?: readonly [number, number];
}

/**
 * Where the run's garbage points: a key of `keys`, and an ID in `range` or, half the time, above
 * it, where no worker allocates; drawn with the run's `random`.
 */
export function garbageTargets(
  keys: readonly string[],
  range: { readonly min: number; readonly max: number },
  random: () => number,
): GarbageTargets {
  return {
    key: () => keys[Math.floor(random() * keys.length)],
    id: () =>
      random() < 0.5
        ? between(random, range.min, range.max)
        : range.max + 100_000 + Math.floor(random() * 100_000),
  };
}

/** Kinds that act on one worker. */
const WORKER_FAULTS: ReadonlySet<string> = new Set(["kill", "stall", "lease-revoke"]);

/** Whether `kind` is one of the store's own faults (one at a time, even when faults overlap). */
function isStoreFault(ctx: FaultContext, kind: string): boolean {
  return Object.hasOwn(ctx.storeFaults, kind);
}

/**
 * How long a stall lasts: past the lease (and the clock slack that others allow it), then two
 * GC passes and a margin, so a stalled node's keys can really be collected meanwhile.
 */
export function stallMs(timings: NemesisTimings, skewMs: number): number {
  return timings.leaseTtlMs + skewMs + 2 * timings.gcIntervalMs + 2_000;
}

/** Runs faults until `until` (ms since the epoch); a fault in progress is finished. */
export async function runNemesis(
  ctx: FaultContext,
  kinds: readonly string[],
  until: number,
  signal?: AbortSignal,
): Promise<void> {
  if (kinds.length === 0) return;
  let order: string[] = [];
  let garbageOrder: string[] = [];
  /** Every kind once, each garbage kind too: tried before `until` is looked at. */
  const firstRound = shuffle(ctx.random, [
    ...kinds.filter((k) => k !== "garbage").map((kind) => ({ kind, garbage: undefined })),
    ...(kinds.includes("garbage") ? ctx.garbage : []).map((garbage) => ({
      kind: "garbage" as const,
      garbage,
    })),
  ]);
  /** Worker slots and the store with a fault in progress (overlapping faults only). */
  const busySlots = new Set<number>();
  let storeBusy = false;
  const running = new Set<Promise<void>>();
  while ((Date.now() < until || firstRound.length > 0) && !signal?.aborted) {
    const first = firstRound.shift();
    let kind: string;
    let garbage: string | undefined;
    if (first !== undefined) {
      ({ kind, garbage } = first);
    } else {
      if (order.length === 0) order = shuffle(ctx.random, [...kinds]);
      kind = order.shift()!;
      if (kind === "garbage") {
        if (garbageOrder.length === 0) garbageOrder = shuffle(ctx.random, [...ctx.garbage]);
        garbage = garbageOrder.shift();
      }
    }
    let slot = Math.floor(ctx.random() * ctx.slots);
    if (ctx.overlapEveryMs !== undefined && WORKER_FAULTS.has(kind)) {
      const free = [...Array(ctx.slots).keys()].filter((i) => !busySlots.has(i));
      slot = free.length === 0 ? -1 : free[slot % free.length];
    }
    const skip = slot < 0 || (ctx.overlapEveryMs !== undefined && isStoreFault(ctx, kind) &&
      storeBusy);
    const run = async () => {
      const start = Date.now();
      ctx.begin?.(garbage ? `garbage/${garbage}` : kind, start);
      try {
        ctx.record(await inject(ctx, kind, garbage, start, slot));
      } catch (err) {
        const label = garbage ? `garbage/${garbage}` : labelOf(ctx, kind);
        ctx.record({ kind, label, start, end: Date.now(), detail: "", error: String(err) });
      }
    };
    if (ctx.overlapEveryMs === undefined) {
      await run();
      await sleep(between(ctx.random, 1_000, 3_000), signal).catch(() => {});
      continue;
    }
    if (!skip) {
      const worker = WORKER_FAULTS.has(kind);
      if (worker) busySlots.add(slot);
      if (isStoreFault(ctx, kind)) storeBusy = true;
      const task: Promise<void> = run().finally(() => {
        running.delete(task);
        if (worker) busySlots.delete(slot);
        if (isStoreFault(ctx, kind)) storeBusy = false;
      });
      running.add(task);
    } else if (first !== undefined) {
      // Its worker or the store is busy: it is tried later, still in the first round.
      firstRound.push(first);
    }
    const [min, max] = ctx.overlapEveryMs;
    await sleep(between(ctx.random, min, max), signal).catch(() => {});
  }
  await Promise.all(running);
}

async function inject(
  ctx: FaultContext,
  kind: string,
  garbage: string | undefined,
  start: number,
  slot: number,
): Promise<FaultRecord> {
  const done = (label: string, detail: string, extra: Partial<FaultRecord> = {}): FaultRecord => ({
    kind,
    label,
    start,
    end: Date.now(),
    detail,
    ...extra,
  });
  switch (kind) {
    case "kill": {
      const before = ctx.target(slot);
      const rename = ctx.random() < 0.5;
      const down = between(ctx.random, 200, 2_000);
      before.signal("SIGKILL");
      await sleep(down);
      const after = await ctx.restart(slot, rename);
      return done(
        rename ? "kill (new name)" : "kill (same name)",
        `SIGKILL ${before.node} (${before.inc}), restarted after ${down} ms as ${after.node} (${after.inc})`,
        { inc: before.inc, restartedAs: after.inc },
      );
    }
    case "stall": {
      const t = ctx.target(slot);
      const ms = Math.round(stallMs(ctx.timings, ctx.skewMs) * (1 + ctx.random() * 0.5));
      const from = Date.now();
      t.signal("SIGSTOP");
      await sleep(ms);
      t.signal("SIGCONT");
      const to = Date.now();
      ctx.stopped({ inc: t.inc, from, to });
      return done(
        FAULT_LABELS[kind],
        `SIGSTOP ${t.node} (${t.inc}) for ${to - from} ms, then SIGCONT`,
        { inc: t.inc },
      );
    }
    case "lease-revoke": {
      const t = ctx.target(slot);
      return done(FAULT_LABELS[kind], await ctx.store.revokeLease(t.node, ctx.random), {
        inc: t.inc,
      });
    }
    case "garbage": {
      const planted = await ctx.store.plant(garbage!, ctx.garbageTargets);
      return done(`garbage/${garbage}`, planted.entries.join("; ") || "nothing free to plant on", {
        plantedMasters: planted.masterIds,
      });
    }
    default: {
      const { detail, backAt } = await ctx.store.injectFault!(kind, ctx.random);
      return done(labelOf(ctx, kind), detail, backAt === undefined ? {} : { backAt });
    }
  }
}

/** The table's row of fault `kind`. */
function labelOf(ctx: FaultContext, kind: string): string {
  if (Object.hasOwn(FAULT_LABELS, kind)) return FAULT_LABELS[kind as NemesisFault];
  return ctx.storeFaults[kind] ?? kind;
}
