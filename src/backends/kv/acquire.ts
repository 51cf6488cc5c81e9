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
 * @module
 */
import type { AcquireRequest, AcquireResult } from "../../allocator/backend.ts";
import { ConflictError, CorruptEntryError, PoolExhaustedError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { appendLog, commit, getMany, type KvContext, type KvStats } from "./io.ts";
import type { LeaseKeeper } from "./lease.ts";
import { MAX_ACQUIRE_ROUNDS, MAX_LEASE_CHASES } from "./limits.ts";
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
  /** The key index names an ID whose master belongs to another key: drop the index. */
  | { readonly kind: "dropIndex"; readonly version: string };

/** Runs the acquire protocol for `req` (see the module doc). */
export async function acquire(
  ctx: KvContext,
  stats: KvStats,
  lease: LeaseKeeper,
  req: AcquireRequest,
): Promise<AcquireResult> {
  const { key, signal } = req;
  const { layout, settings } = ctx;
  const exclude = new Set<number>();
  // A hint that cannot be a versionstamp (say, from another backend's cache) is ignored: the
  // store would reject the check outright instead of failing it.
  let plan: Plan = req.hint && VERSIONSTAMP.test(req.hint.version)
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
    const id: number = plan.kind === "new" ? pick(req, exclude) : plan.id;
    const op = ctx.kv.atomic();
    if (plan.kind === "new") {
      op.check(
        { key: layout.key(key), versionstamp: null },
        { key: layout.id(id), versionstamp: null },
      );
      writePair(ctx, op, key, id);
    } else if (plan.kind === "existing") {
      op.check(
        { key: layout.key(key), versionstamp: plan.version },
        { key: layout.id(id), versionstamp: plan.version },
      );
    } else {
      op.check(
        { key: layout.key(key), versionstamp: plan.index },
        { key: layout.id(id), versionstamp: plan.master },
      );
      writePair(ctx, op, key, id);
    }
    // The touch counter is what a concurrent GC delete of this key's master checks.
    op.sum(layout.touch(key), 1n).set(layout.ref(key, settings.node), { id, lease: leaseId });
    const res = await commit(stats, op, signal);
    if (res.ok) {
      if (plan.kind === "new" || (plan.kind === "repair" && plan.master === null)) created = true;
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
    plan = await replan(ctx, stats, key, id, exclude, signal);
  }
  throw new ConflictError(
    `could not acquire key '${key}' in ${MAX_ACQUIRE_ROUNDS} rounds: the store kept changing`,
  );
}

function pick(req: AcquireRequest, exclude: ReadonlySet<number>): number {
  const candidate = req.pickCandidate(exclude);
  if (candidate === undefined) {
    throw new PoolExhaustedError(Number.NaN, Number.NaN, {
      cause: new Error(`no candidate ID left for key '${req.key}'`),
    });
  }
  return candidate;
}

/** Adds master + key index for `key` → `id` (one versionstamp) and the change-feed entry. */
export function writePair(
  ctx: KvContext,
  op: Deno.AtomicOperation,
  key: string,
  id: number,
): Deno.AtomicOperation {
  return appendLog(ctx, setPair(ctx, op, key, id), [{ id, key }]);
}

/** Adds master + key index for `key` → `id` only (the caller logs the change). */
export function setPair(
  ctx: KvContext,
  op: Deno.AtomicOperation,
  key: string,
  id: number,
): Deno.AtomicOperation {
  return op.set(ctx.layout.id(id), { key }).set(ctx.layout.key(key), { id });
}

/** After a failed commit: one snapshot read of the key index and master `id` picks the next plan. */
async function replan(
  ctx: KvContext,
  stats: KvStats,
  key: string,
  id: number,
  exclude: Set<number>,
  signal: AbortSignal,
): Promise<Plan> {
  const [index, master] = await getMany(
    ctx,
    stats,
    [ctx.layout.key(key), ctx.layout.id(id)],
    signal,
  );
  if (index.versionstamp !== null) {
    const named = decode.keyIndex(index as Deno.KvEntry<unknown>);
    if (named === undefined) {
      throw new CorruptEntryError(`the key index of '${key}' is corrupt; it is not overwritten`);
    }
    // The commit of an "existing" plan checks that master and index agree, so an unknown master
    // is fine here.
    if (named.id !== id) return { kind: "existing", id: named.id, version: index.versionstamp };
    if (master.versionstamp === null) {
      return { kind: "repair", id, index: index.versionstamp, master: null };
    }
    if (decode.master(master as Deno.KvEntry<unknown>)?.key === key) {
      return master.versionstamp === index.versionstamp
        ? { kind: "existing", id, version: index.versionstamp }
        : { kind: "repair", id, index: index.versionstamp, master: master.versionstamp };
    }
    log.warning("key index of {key} names ID {id}, whose master belongs elsewhere: dropping it", {
      key,
      id,
    });
    exclude.add(id);
    return { kind: "dropIndex", version: index.versionstamp };
  }
  if (master.versionstamp !== null) {
    // A master for this key without its index (store damage): adopt it rather than duplicate it.
    if (decode.master(master as Deno.KvEntry<unknown>)?.key === key) {
      return { kind: "repair", id, index: null, master: master.versionstamp };
    }
    exclude.add(id);
  }
  return { kind: "new" };
}
