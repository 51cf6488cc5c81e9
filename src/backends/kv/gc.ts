/**
 * GC on Deno KV. A candidate's version is `<master versionstamp>:<touch versionstamp or ->`: it
 * changes when the master is rewritten and whenever any node acquires the key (every acquire
 * rewrites the touch entry).
 *
 * `gcDelete` commits only if master, key index, touch counter, every dead reference and the lease
 * record that made it dead are all unchanged since they were read. Deno KV has no range checks,
 * so a reference created after the read is caught through the touch counter, which every writer
 * of a reference also changes.
 *
 * A writable session's `gcList` also sweeps dead node state as it goes (`sweep.ts`): the dead
 * references of keys that stay in use, from the references and lease records it reads anyway,
 * and after a complete pass the expired lease records of nodes without references left.
 *
 * One bad entry never stops a pass: a master that cannot be read, or whose key is too large for
 * any of its per-key entries to be read, and a reference that cannot be read, are logged,
 * reported to `onSkip` and left alone (a skipped master is never a candidate).
 *
 * @module
 */
import type { GcCandidate, GcListOptions } from "../../allocator/backend.ts";
import type { GcSkip } from "../../allocator/damage.ts";
import { commit, commitLogged, get, getMany, type KvStats, list, loggedAtomic } from "./client.ts";
import type { KvContext } from "./context.ts";
import { keyBytes } from "./layout.ts";
import { COMMIT_KEY_BUDGET, GC_FIXED_CHECKS, LIST_BATCH } from "./limits.ts";
import { isLive, type LeaseRecord, readLeases, readRefs, type Reference } from "./liveness.ts";
import { corrupt, decode, formatKey } from "./schema.ts";
import { sweepLeases, sweepRefs } from "./sweep.ts";

/** Masters judged per batch of reads in `gcList`. */
const GC_LIST_CHUNK = 100;

interface Master {
  readonly id: number;
  readonly key: string;
  readonly versionstamp: string;
}

/** What one `gcList` pass carries from chunk to chunk. */
interface Pass {
  /** Whether to sweep dead node state (writable sessions only). */
  readonly sweep: boolean;
  /** Lease records read so far. */
  readonly leases: Map<string, LeaseRecord>;
  /** Nodes with references the pass saw and did not delete. */
  readonly referenced: Set<string>;
  /** Where damaged entries are reported. */
  readonly onSkip: (skip: GcSkip) => void;
}

/**
 * Every master with `min <= id <= max`, with its GC version and whether it is in use now. With
 * `sweep`, also deletes dead references of keys in use and, once the listing completed, expired
 * lease records of nodes without references left (see `sweep.ts`).
 */
export async function* gcList(
  ctx: KvContext,
  stats: KvStats,
  range: { min: number; max: number },
  signal: AbortSignal,
  options: GcListOptions & { readonly sweep: boolean },
): AsyncGenerator<GcCandidate> {
  const { layout } = ctx;
  const pass: Pass = {
    sweep: options.sweep,
    leases: new Map(),
    referenced: new Set(),
    onSkip: options.onSkip ?? (() => {}),
  };
  const skip = (entry: Deno.KvEntry<unknown>, kind: GcSkip["kind"], reason: string) =>
    pass.onSkip({ kind, entry: formatKey(entry.key), reason });
  let chunk: Master[] = [];
  const selector = { start: layout.id(range.min), end: layout.id(range.max + 1) };
  for await (const entry of list(ctx, stats, selector, signal, LIST_BATCH)) {
    const id = layout.parseId(entry.key);
    if (id === undefined || id < range.min || id > range.max) {
      corrupt(entry.key, "not a master key");
      skip(entry, "master-bad-id", "not a master key");
      continue;
    }
    const value = decode.master(entry);
    if (value === undefined) {
      skip(entry, "master-undecodable", "not a master value");
      continue;
    }
    if (!layout.fitsKey(value.key)) {
      corrupt(entry.key, "its key is too large for the layout");
      skip(entry, "master-oversized", "its key is too large for the layout");
      continue;
    }
    chunk.push({ id, key: value.key, versionstamp: entry.versionstamp });
    if (chunk.length >= GC_LIST_CHUNK) {
      yield* judge(ctx, stats, chunk, pass, signal);
      chunk = [];
    }
  }
  yield* judge(ctx, stats, chunk, pass, signal);
  // Only after a complete pass is `referenced` complete for the range (a consumer that stops
  // early ends the generator before this point).
  if (pass.sweep) await sweepLeases(ctx, stats, pass.referenced, signal);
}

async function* judge(
  ctx: KvContext,
  stats: KvStats,
  masters: readonly Master[],
  pass: Pass,
  signal: AbortSignal,
): AsyncGenerator<GcCandidate> {
  if (masters.length === 0) return;
  const { leases, referenced } = pass;
  const touches = await getMany(ctx, stats, masters.map((m) => ctx.layout.touch(m.key)), signal);
  // Each key's references are their own read either way (the commit in `gcDelete` re-checks what
  // matters); reading them together saves a wait on the store per master.
  const refs = await Promise.all(
    masters.map((m) => readRefs(ctx, stats, m.key, signal, pass.onSkip)),
  );
  await readLeases(ctx, stats, refs.flat().map((r) => r.node), signal, leases);
  const now = ctx.settings.now();
  const candidates: GcCandidate[] = [];
  // Dead references of keys in use: nothing else deletes them, as their master is not collected.
  // Those of unused keys go with their master in `gcDelete`.
  const dead: Reference[] = [];
  for (const [i, m] of masters.entries()) {
    const alive = refs[i].map((r) => live(ctx, r, leases, now));
    const inUse = alive.includes(true);
    candidates.push({
      id: m.id,
      key: m.key,
      version: gcVersion(m.versionstamp, touches[i].versionstamp),
      inUse,
    });
    refs[i].forEach((r, j) => {
      if (pass.sweep && inUse && !alive[j]) dead.push(r);
      else referenced.add(r.node);
    });
  }
  for (const r of await sweepRefs(ctx, stats, dead, leases, signal)) referenced.add(r.node);
  yield* candidates;
}

/**
 * Deletes `candidate`'s master, key index, touch counter and dead references if, at the commit,
 * nothing changed and no reference is live. Returns whether it deleted.
 */
export async function gcDelete(
  ctx: KvContext,
  stats: KvStats,
  candidate: GcCandidate,
  signal: AbortSignal,
): Promise<boolean> {
  const { layout } = ctx;
  const { id, key } = candidate;
  // A candidate no listing could have produced (see gcList) names nothing deletable.
  if (!layout.fitsKey(key)) return false;
  // Touch first: a reference written after this read changes the counter, so the commit's
  // check on it fails even though the listing below cannot see that reference.
  const touch = await get(ctx, stats, layout.touch(key), signal);
  let refs = await readRefs(ctx, stats, key, signal);
  const leases = await readLeases(ctx, stats, refs.map((r) => r.node), signal);
  const now = ctx.settings.now();
  if (refs.some((r) => live(ctx, r, leases, now))) return false;
  const [master, index] = await getMany(ctx, stats, [layout.id(id), layout.key(key)], signal);
  if (master.versionstamp === null) return false;
  if (decode.master(master as Deno.KvEntry<unknown>)?.key !== key) return false;
  if (gcVersion(master.versionstamp, touch.versionstamp) !== candidate.version) return false;
  // Deleting a dead reference is safe on its own (guarded by it and its lease record), so a key
  // with more dead references than one commit can check sheds them in separate commits first.
  const perCommit = deadRefsPerCommit(ctx, refs, key);
  while (refs.length > perCommit) {
    const op = ctx.kv.atomic();
    guardRefs(ctx, op, refs.slice(0, perCommit), leases);
    if (!(await commit(stats, op, signal)).ok) return false;
    refs = refs.slice(perCommit);
  }
  const op = loggedAtomic(ctx, [{ id, key: null }]).check(
    { key: layout.id(id), versionstamp: master.versionstamp },
    { key: layout.key(key), versionstamp: index.versionstamp },
    { key: layout.touch(key), versionstamp: touch.versionstamp },
  );
  guardRefs(ctx, op, refs, leases);
  op.delete(layout.id(id)).delete(layout.touch(key));
  // The index goes with its master, unless it names another ID (then it is checked, not touched).
  const named = index.versionstamp === null
    ? undefined
    : decode.keyIndex(index as Deno.KvEntry<unknown>);
  if (named?.id === id) op.delete(layout.key(key));
  return (await commitLogged(ctx, stats, op, signal)).ok;
}

/**
 * How many dead references the final commit can check and delete: bounded by the check limit
 * and by the store's total key size (every reference key may be close to 2 KiB).
 */
function deadRefsPerCommit(ctx: KvContext, refs: readonly Reference[], key: string): number {
  const largest = Math.max(
    ctx.layout.largestKeyBytes(key, ctx.settings.node),
    ...refs.map((r) => keyBytes(ctx.layout.ref(r.key, r.node))),
  );
  // The final commit also writes master, index, touch and a log entry.
  const byBytes = Math.floor((COMMIT_KEY_BUDGET - 4 * largest) / largest);
  const byChecks = Math.floor((ctx.maxChecks - GC_FIXED_CHECKS) / 2);
  return Math.max(1, Math.min(byChecks, byBytes));
}

/** The GC version of a master and its key's touch counter. */
export function gcVersion(masterVs: string, touchVs: string | null): string {
  return `${masterVs}:${touchVs ?? "-"}`;
}

function guardRefs(
  ctx: KvContext,
  op: Deno.AtomicOperation,
  refs: readonly Reference[],
  leases: ReadonlyMap<string, LeaseRecord>,
): void {
  for (const r of refs) {
    const key = ctx.layout.ref(r.key, r.node);
    op.check(
      { key, versionstamp: r.versionstamp },
      { key: ctx.layout.lease(r.node), versionstamp: leases.get(r.node)?.versionstamp ?? null },
    ).delete(key);
  }
}

function live(
  ctx: KvContext,
  r: Reference,
  leases: ReadonlyMap<string, LeaseRecord>,
  now: number,
): boolean {
  return isLive(r.value, leases.get(r.node), now, ctx.settings.maxClockSkewMs);
}
