/**
 * The nemesis: injects faults, chosen by the seed, until the fault phase ends. The enabled kinds
 * are visited in a seeded shuffled order, round after round, so that a short run still sees every
 * kind. Each fault is recorded with its start, end and, for store outages, the instant the store
 * was back (for the recovery time).
 *
 * By default one fault runs at a time, with a pause of 1–3 s after each. With `overlapEveryMs`, a
 * fault starts every so often whether the others have ended or not (a stall of one worker while
 * another is killed or revoked): each worker and the store's members take one fault at a time.
 *
 * @module
 */
import { sleep } from "../src/abort.ts";
import { between, shuffle } from "../tests/_support/prng.ts";
import type { FaultKind } from "./config.ts";
import type { StopWindow } from "./checks/calls.ts";
import type { GarbageKind, NemesisStore, StoreMembers } from "./stores/store.ts";
import type { Timings } from "./records.ts";

/** The table's row of each kind (refined further by some faults, e.g. `kill (new name)`). */
export const FAULT_LABELS: Readonly<Record<FaultKind, string>> = {
  "kill": "kill",
  "stall": "stall",
  "lease-revoke": "lease revoke",
  "garbage": "garbage",
  "compact": "compaction",
  "kill-follower": "kill etcd follower",
  "kill-leader": "kill etcd leader",
  "outage": "etcd outage",
};

/** One injected fault. */
export interface FaultRecord {
  readonly kind: FaultKind;
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
  readonly store: NemesisStore;
  /** The store's members (etcd's cluster), which the member faults act on. */
  readonly members?: StoreMembers;
  readonly timings: Timings;
  /** Clock slack the workers' backends allow a lease (the store's `skewMs`). */
  readonly skewMs: number;
  readonly garbage: readonly GarbageKind[];
  readonly garbageTargets: Parameters<NemesisStore["plant"]>[1];
  /** Number of worker slots. */
  readonly slots: number;
  target(slot: number): FaultTarget;
  /** SIGKILLs the slot's worker and starts a new incarnation, under a new name if `rename`. */
  restart(slot: number, rename: boolean): Promise<FaultTarget>;
  /** Called as faults end. */
  record(fault: FaultRecord): void;
  /** Called when a worker is stopped and continued. */
  stopped(window: StopWindow): void;
  /** Start a fault every `[min, max]` ms, overlapping those still running (see the module doc). */
  readonly overlapEveryMs?: readonly [number, number];
}

/** Kinds that act on the store's members (one at a time, even when faults overlap). */
const MEMBER_FAULTS: ReadonlySet<FaultKind> = new Set([
  "compact",
  "kill-follower",
  "kill-leader",
  "outage",
]);
/** Kinds that act on one worker. */
const WORKER_FAULTS: ReadonlySet<FaultKind> = new Set(["kill", "stall", "lease-revoke"]);

/**
 * How long a stall lasts: past the lease (and the clock slack that others allow it), then two
 * GC passes and a margin, so a stalled node's keys can really be collected meanwhile.
 */
export function stallMs(timings: Timings, skewMs: number): number {
  return timings.leaseTtlMs + skewMs + 2 * timings.gcIntervalMs + 2_000;
}

/** Runs faults until `until` (ms since the epoch); a fault in progress is finished. */
export async function runNemesis(
  ctx: FaultContext,
  kinds: readonly FaultKind[],
  until: number,
  signal?: AbortSignal,
): Promise<void> {
  if (kinds.length === 0) return;
  let order: FaultKind[] = [];
  let garbageOrder: GarbageKind[] = [];
  /** Worker slots and the members with a fault in progress (overlapping faults only). */
  const busySlots = new Set<number>();
  let membersBusy = false;
  const running = new Set<Promise<void>>();
  while (Date.now() < until && !signal?.aborted) {
    if (order.length === 0) order = shuffle(ctx.random, [...kinds]);
    const kind = order.shift()!;
    let garbage: GarbageKind | undefined;
    if (kind === "garbage") {
      if (garbageOrder.length === 0) garbageOrder = shuffle(ctx.random, [...ctx.garbage]);
      garbage = garbageOrder.shift();
    }
    let slot = Math.floor(ctx.random() * ctx.slots);
    if (ctx.overlapEveryMs !== undefined && WORKER_FAULTS.has(kind)) {
      const free = [...Array(ctx.slots).keys()].filter((i) => !busySlots.has(i));
      slot = free.length === 0 ? -1 : free[slot % free.length];
    }
    const skip = slot < 0 || (ctx.overlapEveryMs !== undefined && MEMBER_FAULTS.has(kind) &&
      membersBusy);
    const run = async () => {
      const start = Date.now();
      try {
        ctx.record(await inject(ctx, kind, garbage, start, slot));
      } catch (err) {
        const label = garbage ? `garbage/${garbage}` : FAULT_LABELS[kind];
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
      if (MEMBER_FAULTS.has(kind)) membersBusy = true;
      const task: Promise<void> = run().finally(() => {
        running.delete(task);
        if (worker) busySlots.delete(slot);
        if (MEMBER_FAULTS.has(kind)) membersBusy = false;
      });
      running.add(task);
    }
    const [min, max] = ctx.overlapEveryMs;
    await sleep(between(ctx.random, min, max), signal).catch(() => {});
  }
  await Promise.all(running);
}

async function inject(
  ctx: FaultContext,
  kind: FaultKind,
  garbage: GarbageKind | undefined,
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
      return done(FAULT_LABELS[kind], await ctx.store.revokeLease(t.node), { inc: t.inc });
    }
    case "garbage": {
      const planted = await ctx.store.plant(garbage!, ctx.garbageTargets);
      return done(`garbage/${garbage}`, planted.entries.join("; ") || "nothing free to plant on", {
        plantedMasters: planted.masterIds,
      });
    }
    case "compact": {
      const cluster = ctx.members!;
      // A watch only meets a compacted revision when it resumes from an older one: break the
      // streams of one member's clients first, compact while they reconnect.
      const member = Math.floor(ctx.random() * cluster.endpoints.length);
      const withKill = ctx.random() < 0.5;
      if (withKill) await cluster.kill(member);
      const revision = await retry(() => cluster.compact());
      if (withKill) {
        await sleep(between(ctx.random, 300, 1_500));
        await cluster.restart(member);
      }
      return done(
        FAULT_LABELS[kind],
        `compacted at revision ${revision}${withKill ? ` while member ${member} was down` : ""}`,
        withKill ? { backAt: Date.now() } : {},
      );
    }
    case "kill-follower":
    case "kill-leader": {
      const cluster = ctx.members!;
      const leader = await cluster.leader();
      const members = cluster.endpoints.map((_, i) => i);
      const followers = members.filter((i) => i !== leader);
      const victim = kind === "kill-leader"
        ? leader
        : followers[Math.floor(ctx.random() * followers.length)];
      const down = between(ctx.random, 1_000, 4_000);
      await cluster.kill(victim);
      await sleep(down);
      await cluster.restart(victim);
      return done(
        FAULT_LABELS[kind],
        `SIGKILL member ${victim}${kind === "kill-leader" ? " (leader)" : ""}, down ${down} ms`,
        { backAt: Date.now() },
      );
    }
    case "outage": {
      const cluster = ctx.members!;
      const members = cluster.endpoints.map((_, i) => i);
      const down = between(ctx.random, 2_000, 6_000);
      await Promise.all(members.map((i) => cluster.kill(i)));
      await sleep(down);
      // Started together: one member alone has no quorum and never turns healthy.
      await Promise.all(members.map((i) => cluster.restart(i)));
      return done(FAULT_LABELS[kind], `every member down for ${down} ms`, { backAt: Date.now() });
    }
  }
}

/** Runs `fn`, retrying a few times: etcd refuses requests for a moment after a leader change. */
async function retry<T>(fn: () => Promise<T>, attempts = 10): Promise<T> {
  for (let i = 1;; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i >= attempts) throw err;
      await sleep(500);
    }
  }
}
