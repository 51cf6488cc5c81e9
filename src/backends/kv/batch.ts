/**
 * Group commit on Deno KV: commits that arrive while one is in flight share the next atomic
 * operation, up to the store's limits (100 checks, 1000 mutations, the total key and payload
 * sizes). The first commit goes out at once, alone: an idle node pays no latency.
 *
 * Deno KV has no per-key conditions inside one atomic operation: one failed check fails it all. So
 * when a shared commit fails its checks, every member is committed again on its own, once — a
 * key's lost race costs its batch-mates exactly one retry, and each member learns its own outcome.
 * Members never share a written key (the later one waits for the next commit).
 *
 * The shared commit keeps the one rule that makes a commit safe whatever the store holds (see
 * `loggedAtomic` in `client.ts`): its first mutation is the single `sum` on `gen`, for all members'
 * change-feed entries together.
 *
 * @example Two new keys committed together when a commit is already in flight
 * ```ts ignore
 * // ignored: needs a session's internal context (tests/backends/kv/batch.test.ts runs it)
 * const batcher = new CommitBatcher(ctx, stats, closing);
 * const [a, b] = await Promise.all([batcher.commit(planA, signal), batcher.commit(planB, signal)]);
 * ```
 *
 * @module
 */
import { commitLogged, type KvStats, type LogChange, loggedAtomic } from "./client.ts";
import type { KvContext } from "./context.ts";
import { keyBytes } from "./layout.ts";
import { COMMIT_KEY_BUDGET, MAX_MUTATIONS } from "./limits.ts";
import { isKvU64 } from "./schema.ts";
import { GroupCommit, type Member, settle } from "../shared/group_commit.ts";

/** Payload a shared commit allows itself (the store's limit is 800 KiB). */
const COMMIT_PAYLOAD_BUDGET = 512 * 1024;

/** One member's part of a commit, as plain data. */
export interface CommitPlan {
  /** Its checks. */
  readonly checks: Deno.AtomicCheck[];
  /** Its sets and deletes (never `sum`/`min`/`max`: see the module doc). */
  readonly mutations: Deno.KvMutation[];
  /** The masters it creates or deletes, for the change feed. */
  readonly changes: LogChange[];
}

/** One plan of a batch. */
type Pending = Member<CommitPlan, Deno.KvCommitResult | Deno.KvCommitError>;

/** Counters of a batcher, for benchmarks and tests. */
export interface CommitBatchStats {
  /** Shared or single commits sent (retries on their own included). */
  commits: number;
  /** Plans committed. */
  plans: number;
  /** Shared commits that failed their checks and were split. */
  splits: number;
  /** The largest shared commit. */
  largest: number;
}

/** Groups concurrent commits of one session (see the module doc). */
export class CommitBatcher {
  /** Counters. */
  readonly stats: CommitBatchStats = { commits: 0, plans: 0, splits: 0, largest: 0 };
  readonly #ctx: KvContext;
  readonly #kvStats: KvStats;
  readonly #closing: AbortSignal;
  readonly #group: GroupCommit<CommitPlan, Deno.KvCommitResult | Deno.KvCommitError>;

  /**
   * @param ctx the store
   * @param kvStats round-trip counters to charge
   * @param closing aborted when the session closes (a shared commit belongs to no one caller)
   * @param enabled false: every plan is its own commit, sent at once
   */
  constructor(ctx: KvContext, kvStats: KvStats, closing: AbortSignal, enabled = true) {
    this.#ctx = ctx;
    this.#kvStats = kvStats;
    this.#closing = closing;
    this.#group = new GroupCommit({
      enabled,
      // Checks, mutations, key bytes, payload bytes.
      limits: [ctx.maxChecks, MAX_MUTATIONS, COMMIT_KEY_BUDGET, COMMIT_PAYLOAD_BUDGET],
      // The shared `gen` sum.
      base: [0, 1, 0, 0],
      measure: sizeOf,
      send: (batch) => batch.length === 1 ? this.#one(batch[0]) : this.#shared(batch),
    });
  }

  /**
   * Commits `plan`, alone when nothing is in flight, else with the next shared commit. Resolves
   * with its own outcome: `{ ok: false }` when one of its checks failed. Rejects with
   * `signal.reason` when it aborts first; a plan already sent may still apply.
   */
  commit(
    plan: CommitPlan,
    signal: AbortSignal,
  ): Promise<Deno.KvCommitResult | Deno.KvCommitError> {
    return this.#group.submit(plan, signal);
  }

  async #shared(batch: Pending[]): Promise<void> {
    this.stats.commits++;
    this.stats.plans += batch.length;
    this.stats.largest = Math.max(this.stats.largest, batch.length);
    this.#kvStats.telemetry?.batch("commit", batch.length);
    let res: Deno.KvCommitResult | Deno.KvCommitError;
    try {
      res = await commitLogged(
        this.#ctx,
        this.#kvStats,
        atomic(this.#ctx, batch.map((p) => p.payload)),
        this.#closing,
      );
    } catch (err) {
      for (const p of batch) settle(p, () => p.reject(err));
      return;
    }
    if (res.ok) {
      for (const p of batch) settle(p, () => p.resolve(res));
      return;
    }
    // Some member's check failed, and the store does not say whose: each commits on its own.
    this.stats.splits++;
    for (const p of batch) await this.#one(p);
  }

  async #one(p: Pending): Promise<void> {
    if (p.settled) return;
    this.stats.commits++;
    this.stats.plans++;
    this.#kvStats.telemetry?.batch("commit", 1);
    try {
      const res = await commitLogged(
        this.#ctx,
        this.#kvStats,
        atomic(this.#ctx, [p.payload]),
        p.signal,
      );
      settle(p, () => p.resolve(res));
    } catch (err) {
      settle(p, () => p.reject(err));
    }
  }
}

/** One atomic operation for `plans`: the shared `gen` sum and feed entries first, then theirs. */
export function atomic(ctx: KvContext, plans: readonly CommitPlan[]): Deno.AtomicOperation {
  const op = loggedAtomic(ctx, plans.flatMap((p) => p.changes));
  for (const plan of plans) {
    if (plan.checks.length > 0) op.check(...plan.checks);
    if (plan.mutations.length > 0) op.mutate(...plan.mutations);
  }
  return op;
}

/** What a plan writes and weighs: checks, mutations (feed entries included), key and payload bytes. */
function sizeOf(plan: CommitPlan): { writes: Set<string>; weights: number[] } {
  const writes = new Set<string>();
  let bytes = 0;
  let payload = 0;
  for (const m of plan.mutations) {
    writes.add(JSON.stringify(m.key));
    const k = keyBytes(m.key);
    bytes += k;
    payload += k + (m.type === "set" ? valueBytes(m.value) : 0);
  }
  for (const c of plan.checks) payload += keyBytes(c.key) + 20;
  // A change-feed entry per change: a short key and value.
  bytes += 128 * plan.changes.length;
  payload += 256 * plan.changes.length;
  return {
    writes,
    weights: [plan.checks.length, plan.mutations.length + plan.changes.length, bytes, payload],
  };
}

/** A generous estimate of a value's serialized size. */
function valueBytes(value: unknown): number {
  if (isKvU64(value)) return 16;
  try {
    return (JSON.stringify(value)?.length ?? 16) * 2 + 16;
  } catch {
    return 1024;
  }
}
