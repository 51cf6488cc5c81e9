/**
 * `ensure` on Deno KV: for each held key, re-create a missing master pair and a missing or dead
 * reference of this node. Reads are batched (3 held keys per snapshot read); the writes of a batch
 * go into as few commits as the store's size limits allow, guarded by the versionstamps read. If a
 * commit loses a race, each key is retried on its own.
 *
 * A re-created reference also rewrites the key's touch entry, exactly like an acquire: a GC
 * delete that judged the key unreferenced must fail if the reference comes back.
 *
 * A key index or master that cannot be read (garbage written over it) is rewritten with the pair,
 * as a missing one is: this node holds the key with this ID, which makes it a live reference that
 * settles the pair (master-key protection). Only a pair entry that names something else is a
 * conflict.
 *
 * @module
 */
import type { EnsureReport, HeldKey } from "../../allocator/backend.ts";
import { ConflictError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { pairMutations, touchMutation } from "./acquire.ts";
import { commitLogged, getMany, type KvStats, type LogChange, loggedAtomic } from "./client.ts";
import type { KvContext } from "./context.ts";
import type { LeaseKeeper } from "./lease.ts";
import { COMMIT_KEY_BUDGET, ENSURE_BATCH, MAX_ENSURE_ROUNDS } from "./limits.ts";
import { decode } from "./schema.ts";
import { batches } from "../shared/batching.ts";

const log = idallocLogger("kv");

/** What one held key needs. */
interface Plan {
  readonly held: HeldKey;
  readonly master: EnsureReport["master"];
  readonly reference: EnsureReport["reference"];
  /** Versionstamps the write is guarded by (`null`: absent). */
  readonly indexVs: string | null;
  readonly masterVs: string | null;
}

/** Runs `ensure` for `held` (see the module doc). */
export async function ensure(
  ctx: KvContext,
  stats: KvStats,
  lease: LeaseKeeper,
  held: readonly HeldKey[],
  signal: AbortSignal,
): Promise<EnsureReport[]> {
  const reports: EnsureReport[] = [];
  for (let i = 0; i < held.length; i += ENSURE_BATCH) {
    await lease.ensureFresh(signal);
    const batch = held.slice(i, i + ENSURE_BATCH);
    const plans = await readPlans(ctx, stats, lease.id, batch, signal);
    let failed = false;
    for (const group of commitGroups(ctx, plans.filter(needsWrite))) {
      const res = await commitLogged(ctx, stats, writes(ctx, group, lease.id), signal);
      failed ||= !res.ok;
    }
    if (failed) {
      // Some group lost a race: re-read every key that needed a write and retry it on its own
      // (keys of groups that did commit now read as ok and cost nothing more).
      for (const [j, plan] of plans.entries()) {
        if (needsWrite(plan)) plans[j] = await ensureOne(ctx, stats, lease, plan.held, signal);
      }
    }
    reports.push(...plans.map(({ held, master, reference }) => ({ ...held, master, reference })));
  }
  return reports;
}

/**
 * Splits writes into commits that stay within the store's total key size: each held key writes
 * at most five keys (master, index, touch, reference, log entry), none longer than its reference.
 */
function commitGroups(ctx: KvContext, writes: readonly Plan[]): Plan[][] {
  const { layout, settings } = ctx;
  // Two checks per held key (its key index and master).
  return batches(
    writes,
    [COMMIT_KEY_BUDGET, ctx.maxChecks],
    (p) => [5 * layout.largestKeyBytes(p.held.key, settings.node), 2],
  );
}

function needsWrite(plan: Plan): boolean {
  return plan.master === "recreated" || plan.reference === "recreated";
}

/** One held key on its own, re-read after every lost race. */
async function ensureOne(
  ctx: KvContext,
  stats: KvStats,
  lease: LeaseKeeper,
  held: HeldKey,
  signal: AbortSignal,
): Promise<Plan> {
  for (let round = 0; round < MAX_ENSURE_ROUNDS; round++) {
    const [plan] = await readPlans(ctx, stats, lease.id, [held], signal);
    if (!needsWrite(plan)) return plan;
    const res = await commitLogged(ctx, stats, writes(ctx, [plan], lease.id), signal);
    if (res.ok) return plan;
  }
  throw new ConflictError(`could not ensure key '${held.key}': the store kept changing`);
}

async function readPlans(
  ctx: KvContext,
  stats: KvStats,
  leaseId: string,
  batch: readonly HeldKey[],
  signal: AbortSignal,
): Promise<Plan[]> {
  const { layout, settings } = ctx;
  const plans: Plan[] = [];
  // Three held keys per snapshot read keep each key's three entries consistent with each other.
  for (let i = 0; i < batch.length; i += 3) {
    const group = batch.slice(i, i + 3);
    const entries = await getMany(
      ctx,
      stats,
      group.flatMap((h) => [layout.key(h.key), layout.id(h.id), layout.ref(h.key, settings.node)]),
      signal,
    );
    group.forEach((h, j) => {
      const [index, master, ref] = entries.slice(3 * j, 3 * j + 3);
      plans.push(classify(h, index, master, ref, leaseId));
    });
  }
  return plans;
}

function classify(
  held: HeldKey,
  index: Deno.KvEntryMaybe<unknown>,
  master: Deno.KvEntryMaybe<unknown>,
  ref: Deno.KvEntryMaybe<unknown>,
  leaseId: string,
): Plan {
  const indexVs = index.versionstamp;
  const masterVs = master.versionstamp;
  const named = indexVs === null ? undefined : decode.keyIndex(index as Deno.KvEntry<unknown>);
  const owner = masterVs === null ? undefined : decode.master(master as Deno.KvEntry<unknown>);
  const conflict = (named !== undefined && named.id !== held.id) ||
    (owner !== undefined && owner.key !== held.key);
  if (conflict) {
    log.warning("cannot ensure {key} → {id}: the key or the ID belongs to something else", {
      ...held,
    });
    return { held, master: "conflict", reference: "skipped", indexVs, masterVs };
  }
  // Both present, readable and written by one commit: intact. Anything else (one missing or
  // unreadable, both, or out of step) is rewritten as a pair so that they share one versionstamp.
  const pairOk = indexVs !== null && indexVs === masterVs && named !== undefined &&
    owner !== undefined;
  const current = ref.versionstamp === null ? undefined : decode.ref(ref as Deno.KvEntry<unknown>);
  const refOk = current?.id === held.id && current.lease === leaseId;
  return {
    held,
    master: pairOk ? "ok" : "recreated",
    reference: refOk ? "ok" : "recreated",
    indexVs,
    masterVs,
  };
}

function writes(ctx: KvContext, plans: readonly Plan[], leaseId: string): Deno.AtomicOperation {
  const { layout, settings } = ctx;
  const changes: LogChange[] = plans
    .filter((p) => p.master === "recreated")
    .map(({ held }) => ({ id: held.id, key: held.key }));
  const op = loggedAtomic(ctx, changes);
  for (const { held, master, reference, indexVs, masterVs } of plans) {
    op.check(
      { key: layout.key(held.key), versionstamp: indexVs },
      { key: layout.id(held.id), versionstamp: masterVs },
    );
    if (master === "recreated") op.mutate(...pairMutations(ctx, held.key, held.id));
    op.mutate(touchMutation(ctx, held.key));
    if (reference === "recreated") {
      op.set(layout.ref(held.key, settings.node), { id: held.id, lease: leaseId });
    }
  }
  return op;
}
