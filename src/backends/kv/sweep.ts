/**
 * The GC pass's sweep of dead node state on Deno KV: dead references of keys that stay in use
 * (their master is never collected, so nothing else would delete them) and expired lease records
 * of nodes that have no references left. With short-lived node names (CLI runs, Deploy isolates,
 * renamed pods) both would otherwise pile up. Neither sweep changes a key's GC version (the touch
 * counter is not written) or deletes a master, so the pass's candidates are unaffected.
 *
 * Every deletion is guarded by the versionstamps it was judged on, so a node that comes back in
 * between (re-acquires a reference, renews or rewrites its lease record) makes the commit fail;
 * the next pass judges again. A failed commit is not retried: a pass costs at most the commits
 * for what it read.
 *
 * Deleting an expired lease record never races a node that is renewing it:
 * - a renewal (or any rewrite) that lands between GC's read and its commit changes the record's
 *   versionstamp, so GC's check fails and the record stays;
 * - a renewal that arrives after the delete fails its own check on the record's last versionstamp,
 *   so the node takes a new lease id and re-creates its references (the same path as a record
 *   that the store's `expireIn` removed). That renewal was not legitimate anyway: GC judged
 *   `expiresAt + maxClockSkewMs <= now` on its clock, and a node renews only while
 *   `now < expiresAt - maxClockSkewMs` on its own; with clocks at most the skew apart the node had
 *   already stopped renewing this lease, and a renewal decided earlier and still in flight is
 *   refused by that check.
 * Nor does a delete change what is live: a reference needs a record with its lease id that has
 * not expired, so references of an expired record are dead with or without it.
 *
 * @example
 * ```ts
 * import type { KvStats } from "./client.ts";
 * import type { KvContext } from "./context.ts";
 * import type { LeaseRecord, Reference } from "./liveness.ts";
 * import { sweepLeases, sweepRefs } from "./sweep.ts";
 *
 * // Needs a session's context and a GC pass's findings: a function here, so that it is type-checked.
 * async function sweep(
 *   ctx: KvContext,
 *   stats: KvStats,
 *   deadRefsOfInUseKeys: Reference[],
 *   leases: Map<string, LeaseRecord>,
 *   signal: AbortSignal,
 * ): Promise<void> {
 *   const left = await sweepRefs(ctx, stats, deadRefsOfInUseKeys, leases, signal);
 *   await sweepLeases(ctx, stats, new Set(left.map((r) => r.node)), signal);
 * }
 * ```
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import { commit, type KvStats, list } from "./client.ts";
import type { KvContext } from "./context.ts";
import { keyBytes } from "./layout.ts";
import { COMMIT_KEY_BUDGET, LIST_BATCH } from "./limits.ts";
import { batches } from "../shared/batching.ts";
import { isExpired, type LeaseRecord, type Reference } from "./liveness.ts";
import { corrupt, decode } from "./schema.ts";

const log = idallocLogger("kv", "gc");

/**
 * Deletes `dead` references (judged dead on `leases`), each guarded by its own versionstamp and
 * its node's lease record's, in commits of at most `ctx.maxChecks` checks. Returns the
 * references it could not delete (a commit whose checks failed).
 */
export async function sweepRefs(
  ctx: KvContext,
  stats: KvStats,
  dead: readonly Reference[],
  leases: ReadonlyMap<string, LeaseRecord>,
  signal: AbortSignal,
): Promise<Reference[]> {
  const { layout } = ctx;
  const left: Reference[] = [];
  // Sorted by node, references of one node share its lease check within a commit.
  const sorted = [...dead].sort((a, b) => a.node < b.node ? -1 : a.node > b.node ? 1 : 0);
  const commits = commitBatches(
    ctx,
    sorted,
    (r, batch) => batch.at(-1)?.node === r.node ? 1 : 2,
    (r) => keyBytes(layout.ref(r.key, r.node)),
  );
  for (const batch of commits) {
    const op = ctx.kv.atomic();
    for (const node of new Set(batch.map((r) => r.node))) {
      op.check({ key: layout.lease(node), versionstamp: leases.get(node)?.versionstamp ?? null });
    }
    for (const r of batch) {
      const key = layout.ref(r.key, r.node);
      op.check({ key, versionstamp: r.versionstamp }).delete(key);
    }
    if (!(await commit(stats, op, signal)).ok) left.push(...batch);
  }
  if (dead.length > 0) {
    log.debug("swept {swept} of {dead} dead references of keys in use", {
      swept: dead.length - left.length,
      dead: dead.length,
    });
  }
  return left;
}

/**
 * Deletes the lease records that expired beyond the skew margin and whose node is not in
 * `referenced` (the nodes with references the pass saw and left), each guarded by the
 * versionstamp read. Live and corrupt records are left alone. Returns how many it deleted.
 *
 * A node may still hold references the pass did not see (keys outside its ID range): they are
 * dead either way (see the module doc). Records of nodes with references the pass left are kept
 * for a later pass, because the guarded deletion of those references checks the record.
 */
export async function sweepLeases(
  ctx: KvContext,
  stats: KvStats,
  referenced: ReadonlySet<string>,
  signal: AbortSignal,
): Promise<number> {
  const { layout, settings } = ctx;
  const expired: { node: string; versionstamp: string }[] = [];
  for await (const entry of list(ctx, stats, { prefix: layout.leases() }, signal, LIST_BATCH)) {
    const node = layout.parseLease(entry.key);
    if (node === undefined) {
      corrupt(entry.key, "not a lease key");
      continue;
    }
    if (referenced.has(node)) continue;
    const value = decode.lease(entry);
    // Judged after the read: an unchanged record that had expired then is expired at the commit.
    if (value !== undefined && isExpired(value, settings.now(), settings.maxClockSkewMs)) {
      expired.push({ node, versionstamp: entry.versionstamp });
    }
  }
  let deleted = 0;
  const commits = commitBatches(ctx, expired, () => 1, (e) => keyBytes(layout.lease(e.node)));
  for (const batch of commits) {
    const op = ctx.kv.atomic();
    for (const { node, versionstamp } of batch) {
      op.check({ key: layout.lease(node), versionstamp }).delete(layout.lease(node));
    }
    if ((await commit(stats, op, signal)).ok) deleted += batch.length;
  }
  if (expired.length > 0) {
    log.debug("swept {deleted} of {expired} expired lease records without references", {
      deleted,
      expired: expired.length,
    });
  }
  return deleted;
}

/**
 * Splits `items` into consecutive batches within one commit's limits: at most `ctx.maxChecks`
 * checks (`checks` of an item given the batch so far) and {@linkcode COMMIT_KEY_BUDGET} bytes of
 * written keys (the store counts written keys only).
 */
function commitBatches<T>(
  ctx: KvContext,
  items: readonly T[],
  checks: (item: T, batch: readonly T[]) => number,
  bytes: (item: T) => number,
): T[][] {
  return batches(
    items,
    [ctx.maxChecks, COMMIT_KEY_BUDGET],
    (item, batch) => [checks(item, batch), bytes(item)],
  );
}
