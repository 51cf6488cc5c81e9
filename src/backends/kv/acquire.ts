/**
 * `acquire` on Deno KV: one atomic commit when uncontended, no read before it.
 *
 * - New key (no hint): check that neither the key index nor the candidate's master exists, then
 *   write master + key index (one commit, so they share one versionstamp), touch, reference, log
 *   entry and `gen`.
 * - Existing key (hint `{id, version}`): check that the key index and the master both still carry
 *   `version` (they are written together, so a match proves key → ID and ID → key at once), then
 *   touch and reference.
 *
 * When the commit fails, one `getMany` of the key index and the master in question decides the
 * next plan: reference the ID the key index names (reusing a stale unreferenced master instead of
 * duplicating it), exclude a taken candidate, or repair a half-deleted pair. Rounds are bounded.
 *
 * Garbage never decides a key's ID. An index that cannot be read, or names an ID outside
 * `AcquireRequest.range`, and a master of the key's ID that cannot be read, are settled by the
 * key's live references (those whose lease record is live): if they agree on an ID in range, the
 * pair is rewritten for that ID (master-key protection, so no second ID appears while nodes hold
 * the first); if nobody holds the key, the unusable index is dropped and the key gets a new ID.
 * References that disagree, or name an ID out of range or one whose master belongs to another
 * key, end the call with a typed non-retryable error.
 *
 * **A create whose answer was lost** (`AttemptTrail.unconfirmed`, set by an earlier attempt of the
 * same allocation): one commit writes the master, the key index and this node's reference, so
 * they share one versionstamp. The next attempt reads the three first; a master of the key whose
 * versionstamp is this node's reference's was written by that commit, so the key is reported
 * created. No other commit writes this node's reference of the key and a master together while
 * the allocation holds the key's lock.
 *
 * @module
 */
import type { AcquireRequest, AcquireResult, AttemptTrail } from "../../allocator/backend.ts";
import { ConflictError, CorruptEntryError, InvalidIdError, SplitKeyError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { pickCandidate, usable } from "../shared/candidates.ts";
import type { CommitBatcher, CommitPlan } from "./batch.ts";
import { chargeShared, commit, getMany, type KvStats } from "./client.ts";
import type { KvContext } from "./context.ts";
import type { LeaseKeeper } from "./lease.ts";
import { MAX_ACQUIRE_ROUNDS, MAX_LEASE_CHASES } from "./limits.ts";
import { liveRefs, readRefs } from "./liveness.ts";
import { decode } from "./schema.ts";

const log = idallocLogger("kv");

/** Deno KV versionstamps: 10 bytes as 20 hex digits. */
const VERSIONSTAMP = /^[0-9a-f]{20}$/;

/** What the next commit of an acquire does. */
type Plan =
  | { readonly kind: "new" }
  /** Key index and master both carry `version` and name each other. */
  | { readonly kind: "existing"; readonly id: number; readonly version: string }
  /**
   * Rewrite the pair for `id`: one of the two is missing or they are out of step, but neither
   * names anything else. Guarded by the versionstamps read (`null`: absent).
   */
  | {
    readonly kind: "repair";
    readonly id: number;
    readonly index: string | null;
    readonly master: string | null;
  }
  /**
   * Drop the key index: it names an ID whose master belongs to another key, or it cannot decide
   * the key's ID and nobody holds the key.
   */
  | { readonly kind: "dropIndex"; readonly version: string };

/** Runs the acquire protocol for `req` (see the module doc). */
export async function acquire(
  ctx: KvContext,
  stats: KvStats,
  lease: LeaseKeeper,
  batcher: CommitBatcher,
  req: AcquireRequest,
): Promise<AcquireResult> {
  const { key, signal } = req;
  const { layout, settings } = ctx;
  if (req.trail?.unconfirmed) await recognizeCreate(ctx, stats, req, req.trail);
  const exclude = new Set<number>();
  // A hint that cannot be a versionstamp (say, from another backend's cache) is ignored: the
  // store would reject the check outright instead of failing it. So is one outside the range.
  let plan: Plan = req.hint && VERSIONSTAMP.test(req.hint.version) && usable(req.range, req.hint.id)
    ? { kind: "existing", id: req.hint.id, version: req.hint.version }
    : { kind: "new" };
  let created = false;
  let chases = 0;
  for (let round = 0; round < MAX_ACQUIRE_ROUNDS;) {
    signal.throwIfAborted();
    await lease.ensureFresh(signal);
    const leaseId = lease.id;
    if (plan.kind === "dropIndex") {
      const op = ctx.kv.atomic().check({ key: layout.key(key), versionstamp: plan.version });
      await commit(stats, op.delete(layout.key(key)), signal);
      round++;
      plan = { kind: "new" };
      continue;
    }
    const id: number = plan.kind === "new" ? pickCandidate(req, exclude) : plan.id;
    const writesPair = plan.kind !== "existing";
    const [indexVs, masterVs] = plan.kind === "new"
      ? [null, null]
      : plan.kind === "existing"
      ? [plan.version, plan.version]
      : [plan.index, plan.master];
    const commitPlan: CommitPlan = {
      checks: [
        { key: layout.key(key), versionstamp: indexVs },
        { key: layout.id(id), versionstamp: masterVs },
      ],
      mutations: [
        ...(writesPair ? pairMutations(ctx, key, id) : []),
        // The touch entry is what a concurrent GC delete of this key's master checks. A brand-new
        // master needs none: its own fresh versionstamp already tells GC passes apart, and a GC
        // delete checks the touch entry's absence as it checks any versionstamp. (One row less
        // per new key: on a local file, new keys are bound by rows written.)
        ...(plan.kind === "new" ? [] : [touchMutation(ctx, key)]),
        { type: "set", key: layout.ref(key, settings.node), value: { id, lease: leaseId } },
      ],
      changes: writesPair ? [{ id, key }] : [],
    };
    const creates = plan.kind === "new" || (plan.kind === "repair" && plan.master === null);
    if (creates && req.trail) req.trail.unconfirmed = { id };
    const res = await batcher.commit(commitPlan, signal);
    if (req.trail) req.trail.unconfirmed = undefined;
    chargeShared(stats, "commits");
    if (res.ok) {
      if (creates) {
        created = true;
        if (req.trail) req.trail.created = id;
      }
      const version: string = plan.kind === "existing" ? plan.version : res.versionstamp;
      if (lease.id === leaseId) return { id, created, version };
      // The lease was replaced while the commit was in flight: the reference just written names a
      // dead lease. Write it again under the new one (guarded like any existing-key acquire).
      if (++chases > MAX_LEASE_CHASES) {
        throw new ConflictError(`lease of '${settings.node}' kept changing during acquire`);
      }
      plan = { kind: "existing", id, version };
      continue;
    }
    round++;
    plan = await replan(ctx, stats, req, id, exclude);
  }
  throw new ConflictError(
    `could not acquire key '${key}' in ${MAX_ACQUIRE_ROUNDS} rounds: the store kept changing`,
  );
}

/**
 * Whether the create of `trail.unconfirmed` (whose answer was lost) landed: the master of the
 * key carries the versionstamp of this node's reference (see the module doc). Records it in
 * `trail.created`; clears `unconfirmed` either way.
 */
async function recognizeCreate(
  ctx: KvContext,
  stats: KvStats,
  req: AcquireRequest,
  trail: AttemptTrail,
): Promise<void> {
  const { id } = trail.unconfirmed!;
  const { layout, settings } = ctx;
  const [master, ref] = await getMany(
    ctx,
    stats,
    [layout.id(id), layout.ref(req.key, settings.node)],
    req.signal,
  );
  trail.unconfirmed = undefined;
  if (master.versionstamp === null || master.versionstamp !== ref.versionstamp) return;
  if (decode.master(master as Deno.KvEntry<unknown>)?.key === req.key) trail.created = id;
}

/**
 * Master + key index for `key` → `id` (written in one commit, so they share one versionstamp;
 * the caller logs the change).
 */
export function pairMutations(ctx: KvContext, key: string, id: number): Deno.KvMutation[] {
  return [
    { type: "set", key: ctx.layout.id(id), value: { key } },
    { type: "set", key: ctx.layout.key(key), value: { id } },
  ];
}

/**
 * Rewrites `key`'s touch entry (a blind `set`: it never conflicts and never fails). Its value
 * only matters for its versionstamp (see `layout.ts`); it is made here, not once at module load,
 * because `Deno.KvU64` exists only with `--unstable-kv` (and not at all on Node.js), and importing
 * `mod.ts` for etcd alone must not need it.
 */
export function touchMutation(ctx: KvContext, key: string): Deno.KvMutation {
  return { type: "set", key: ctx.layout.touch(key), value: new ctx.KvU64(0n) };
}

/** After a failed commit: one snapshot read of the key index and master `id` picks the next plan. */
async function replan(
  ctx: KvContext,
  stats: KvStats,
  req: AcquireRequest,
  id: number,
  exclude: Set<number>,
): Promise<Plan> {
  const { key, signal } = req;
  const [index, master] = await getMany(
    ctx,
    stats,
    [ctx.layout.key(key), ctx.layout.id(id)],
    signal,
  );
  if (index.versionstamp === null) {
    if (master.versionstamp !== null) {
      // A master for this key without its index (store damage): adopt it rather than duplicate
      // it. `id` is a candidate or the hint, both in range.
      if (decode.master(master as Deno.KvEntry<unknown>)?.key === key) {
        return { kind: "repair", id, index: null, master: master.versionstamp };
      }
      exclude.add(id);
    }
    return { kind: "new" };
  }
  const named = decode.keyIndex(index as Deno.KvEntry<unknown>);
  if (named === undefined || !usable(req.range, named.id)) {
    log.warning("key index of {key} is corrupt or names an ID out of range", { key });
    return await settleByReferences(ctx, stats, req, index.versionstamp, exclude);
  }
  // The commit of an "existing" plan checks that master and index agree, so an unknown master
  // is fine here.
  if (named.id !== id) return { kind: "existing", id: named.id, version: index.versionstamp };
  if (master.versionstamp === null) {
    return { kind: "repair", id, index: index.versionstamp, master: null };
  }
  const owner = decode.master(master as Deno.KvEntry<unknown>);
  if (owner?.key === key) {
    return master.versionstamp === index.versionstamp
      ? { kind: "existing", id, version: index.versionstamp }
      : { kind: "repair", id, index: index.versionstamp, master: master.versionstamp };
  }
  if (owner === undefined) {
    // The master of the key's ID is garbage: it may still be in use here or elsewhere.
    return await settleByReferences(ctx, stats, req, index.versionstamp, exclude, id);
  }
  log.warning("key index of {key} names ID {id}, whose master belongs elsewhere: dropping it", {
    key,
    id,
  });
  exclude.add(id);
  return { kind: "dropIndex", version: index.versionstamp };
}

/**
 * The key index (at `indexVs`) cannot decide the key's ID: it is corrupt, names an ID outside the
 * range, or names `brokenId`, whose master is corrupt. The key's live references decide instead
 * (see the module doc); references that cannot be read, or have no live lease record, count for
 * nothing.
 */
async function settleByReferences(
  ctx: KvContext,
  stats: KvStats,
  req: AcquireRequest,
  indexVs: string,
  exclude: Set<number>,
  brokenId?: number,
): Promise<Plan> {
  const { key, signal } = req;
  const live = await liveRefs(ctx, stats, await readRefs(ctx, stats, key, signal), signal);
  const ids = [...new Set(live.map((r) => r.value.id))];
  if (ids.length > 1) throw new SplitKeyError(key, ids);
  if (ids.length === 0) {
    // Nobody holds the key: its unusable index goes (guarded), and the key gets a new ID.
    if (brokenId !== undefined) exclude.add(brokenId);
    return { kind: "dropIndex", version: indexVs };
  }
  const [id] = ids;
  if (!usable(req.range, id)) {
    throw new InvalidIdError(
      `ID ${id} of key '${key}' in the store is outside this allocator's range` +
        (req.range ? ` [${req.range.min}, ${req.range.max}]` : "") +
        `; the key gets no other ID`,
    );
  }
  const [master] = await getMany(ctx, stats, [ctx.layout.id(id)], signal);
  if (master.versionstamp !== null) {
    const owner = decode.master(master as Deno.KvEntry<unknown>);
    if (owner !== undefined && owner.key !== key) {
      throw new CorruptEntryError(
        `live references of key '${key}' name ID ${id}, whose master belongs to another key`,
      );
    }
  }
  log.warning("rewriting master and index of {key} → {id} from its live references", {
    key,
    id,
  });
  return { kind: "repair", id, index: indexVs, master: master.versionstamp };
}
