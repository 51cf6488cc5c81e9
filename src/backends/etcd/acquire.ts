/**
 * Lock-free acquisition of a key's ID: one guarded transaction when uncontended, at most two in
 * the usual races, and a hard bound of {@linkcode MAX_ACQUIRE_ROUNDS}.
 *
 * - **New key** (no hint): `if id/<c> absent ∧ value/<K>/ empty then put master + reference else
 *   read value/<K>/ and id/<c>`. The failure branch is the read the next round needs.
 * - **Existing key** (a hint, or references found): `if id/<N> = K then [agreement ladder: put
 *   reference] else read value/<K>/ and id/<N>` (see `txn.ts` for the ladder).
 * - **Hidden range** (`value/<K>/` also holds references of keys `K/…`): the read is matched
 *   exactly, and the next round's guard becomes "nothing in the range changed since that read",
 *   which the other keys' references cannot fail forever.
 * - **Cilium's mutexes**: every write also requires that no Cilium node holds the allocation
 *   mutex of the key or the GC mutex of the ID (see {@linkcode MutexGuard}); a held one ends the
 *   call with a retryable {@linkcode KeyLockedError}, and the allocator waits.
 *
 * - **Split key** (its references name several IDs: Cilium's own writes): join the newest master
 *   naming the key among them, the ID Cilium's lookup gives it (see `split.ts`); the guard is
 *   "that master and the references unchanged since they were read".
 *
 * Only well-formed references on a lease, naming an ID in the allocator's range, say which ID a
 * key has: a reference written without a lease (by hand, by a broken tool) never dictates one. When
 * they agree on an ID whose master is corrupt, or names a key that holds no live reference to it,
 * the master is repaired from them (as master-key protection would) instead of giving the key a
 * second ID.
 *
 * **A create whose answer was lost**: the transaction that creates a master also puts this node's
 * reference, so the reference's mod revision is the master's create revision (revisions compared
 * for equality only: one transaction has one revision, and nothing else writes this node's
 * reference while the allocation holds the key's lock). The client resends a request whose
 * connection broke; a resent create that fails because its first send landed finds exactly that
 * in its failure branch's read, and answers the key created. When the client gave up instead
 * (`AttemptTrail.unconfirmed`), the allocation's next attempt reads the master and the reference
 * first, and records the create if they match.
 *
 * @example One acquisition through a session (the allocator normally does this)
 * ```ts ignore
 * // ignored: needs a session's context on a running etcd (tests/backends/etcd/acquire.test.ts)
 * const { id, created } = await acquire(ctx, {
 *   key: "k8s:app=web;",
 *   pickCandidate: (exclude) => (exclude.has(300) ? undefined : 300),
 *   signal: AbortSignal.timeout(5_000),
 * });
 * ```
 *
 * @module
 */
import type { ICompare, IKeyValue, IRequestOp, IResponseOp } from "../../deps/etcd3.ts";
import type { TxnRequest, TxnResult } from "./batch.ts";
import type {
  AcquireRequest,
  AcquireResult,
  AttemptTrail,
  IdRange,
} from "../../allocator/backend.ts";
import {
  ConflictError,
  CorruptEntryError,
  InvalidIdError,
  KeyLockedError,
  PoolExhaustedError,
  SplitKeyError,
} from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { LeaseNotFound } from "./client.ts";
import type { EtcdContext } from "./context.ts";
import type { EtcdLayout } from "./layout.ts";
import {
  absent,
  agreementLadder,
  type ByteRange,
  kvsAt,
  ladderOutcome,
  type MasterState,
  modIs,
  MutexGuard,
  prefixRange,
  put,
  read,
  type RefSnapshot,
  snapshotOf,
  strictText,
  unchangedSince,
  valueIs,
} from "./txn.ts";
import { MAX_ACQUIRE_ROUNDS } from "./limits.ts";
import { logSplit, newestMaster, referencedIds } from "./split.ts";

const log = idallocLogger("etcd", "acquire");

/** What the next round of an acquisition does (see {@linkcode plan}). */
export type Plan =
  | { readonly kind: "read" }
  | { readonly kind: "new"; readonly id: number }
  | { readonly kind: "existing"; readonly id: number }
  | { readonly kind: "recreate"; readonly id: number }
  /**
   * Rewrite the master of the ID the key's live references name: its value is corrupt, or names a
   * key that no live reference holds with that ID (`owner`, whose range must stay unchanged).
   */
  | {
    readonly kind: "repair";
    readonly id: number;
    readonly mod: string;
    readonly owner?: { readonly range: ByteRange; readonly revision: string };
  }
  /** Read the references of the key the master names, before deciding whose the ID is. */
  | { readonly kind: "readOwner"; readonly id: number; readonly owner: string }
  /** The references name several IDs: read the masters not known yet, to find the newest. */
  | { readonly kind: "readMasters"; readonly ids: readonly number[] }
  /** Join the newest master of a split key, if it and the references are unchanged. */
  | { readonly kind: "joinSplit"; readonly id: number; readonly mod: string };

/** A plan that only reads. */
export type ReadPlan = Extract<Plan, { kind: "read" | "readOwner" | "readMasters" }>;

/** A plan that writes (every kind but the reads). */
export type WritePlan = Exclude<Plan, ReadPlan>;

/** Per-call knowledge gathered from failed rounds. */
export interface Knowledge {
  snapshot?: RefSnapshot;
  readonly masters: Map<number, MasterState>;
  /** IDs that cannot be this key's new master (taken by another key, or lost a race). */
  readonly excluded: Set<number>;
  hint?: { readonly id: number; readonly version?: string };
  /** Reads of the references of keys that masters named: key → snapshot. */
  readonly owners: Map<string, RefSnapshot>;
}

/**
 * The ID the key's references agree on, if any. Throws {@linkcode SplitKeyError} when they name
 * different IDs, and {@linkcode InvalidIdError} when they name one outside `range`.
 */
export function agreedId(
  snapshot: RefSnapshot,
  key: string,
  range: IdRange | undefined,
): number | undefined {
  const ids = new Set<number>();
  for (const ref of snapshot.exact) {
    if (ref.id === undefined) {
      log.warning("ignoring corrupt reference {ref}: {value} is not an ID", {
        ref: ref.etcdKey,
        value: ref.value,
      });
    } else if (ref.lease === "0") {
      // Every node writes its references on its lease; one without is garbage or forged.
      log.warning("ignoring reference {ref} without a lease", { ref: ref.etcdKey });
    } else {
      ids.add(ref.id);
    }
  }
  if (ids.size > 1) throw splitKeyError(key, [...ids]);
  const [id] = ids;
  if (id !== undefined && range !== undefined && (id < range.min || id > range.max)) {
    throw new InvalidIdError(
      `ID ${id} of key '${key}' in the store is outside this allocator's range ` +
        `[${range.min}, ${range.max}]; the key gets no other ID`,
    );
  }
  return id;
}

function splitKeyError(key: string, ids: readonly number[]): SplitKeyError {
  const err = new SplitKeyError(key, ids);
  log.error("{message}", { message: err.message });
  return err;
}

/**
 * The ID a read of `key`'s references gives it (`getNoCache`): the one they agree on, or for a
 * split key the newest master naming it among theirs (one more read; see `split.ts`).
 */
export async function idOfReferences(
  ctx: EtcdContext,
  snapshot: RefSnapshot,
  key: string,
  signal: AbortSignal,
): Promise<number | undefined> {
  const ids = referencedIds(snapshot);
  if (ids.length < 2) return agreedId(snapshot, key, undefined);
  const newest = newestMaster(key, ids, await readMasters(ctx, ids, signal));
  if (!newest) throw splitKeyError(key, ids);
  return newest.id;
}

/**
 * Decides the next round from what the call knows: join the ID the key's references agree on
 * (re-creating or repairing its master when needed), reuse the hinted master, or create a master
 * for a new candidate; a read first when that is needed to decide.
 */
export function plan(
  k: Knowledge,
  key: string,
  req: Pick<AcquireRequest, "pickCandidate" | "range">,
  layout: EtcdLayout,
): Plan {
  const split = k.snapshot ? planSplit(k, k.snapshot, key, req.range) : undefined;
  if (split) return split;
  const agreed = k.snapshot ? agreedId(k.snapshot, key, req.range) : undefined;
  if (agreed !== undefined) {
    // The key is live under `agreed`: join it; re-create its master only if it is gone.
    const m = k.masters.get(agreed);
    if (m === null) return { kind: "recreate", id: agreed };
    if (m === undefined || m.value === key) return { kind: "existing", id: agreed };
    if (m.corrupt) return { kind: "repair", id: agreed, mod: m.mod };
    // The master names another key: it is that key's only if a live reference of it agrees.
    const owner = k.owners.get(m.value);
    if (owner === undefined) return { kind: "readOwner", id: agreed, owner: m.value };
    if (owner.exact.some((r) => r.id === agreed && r.lease !== "0")) {
      throw new CorruptEntryError(
        `key '${key}' is referenced under ID ${agreed}, whose master names '${m.value}', which ` +
          "holds it too: the store is inconsistent; remove the wrong references",
      );
    }
    const range = prefixRange(layout.refPrefix(m.value) + "/");
    return { kind: "repair", id: agreed, mod: m.mod, owner: { range, revision: owner.revision } };
  }
  const hint = k.hint;
  if (hint !== undefined) {
    const m = k.masters.get(hint.id);
    // Prefer an existing (unreferenced) master of this key over burning a new ID.
    if (m === undefined || (m !== null && m.value === key)) {
      return { kind: "existing", id: hint.id };
    }
    k.excluded.add(hint.id);
  }
  const candidate = req.pickCandidate(k.excluded);
  if (candidate === undefined) {
    // The cache may lag: make sure the key is not live elsewhere before calling the pool empty.
    if (!k.snapshot) return { kind: "read" };
    throw new PoolExhaustedError(Number.NaN, Number.NaN, {
      cause: new Error(`no candidate ID left for key '${key}'`),
    });
  }
  return { kind: "new", id: candidate };
}

/**
 * For a key whose references name several IDs: read the masters not known yet, then join the
 * newest one naming the key (see `split.ts`); `undefined` when the references do not disagree.
 */
function planSplit(
  k: Knowledge,
  snapshot: RefSnapshot,
  key: string,
  range: IdRange | undefined,
): Plan | undefined {
  const ids = referencedIds(snapshot);
  if (ids.length < 2) return undefined;
  const unknown = ids.filter((id) => !k.masters.has(id));
  if (unknown.length > 0) return { kind: "readMasters", ids: unknown };
  const newest = newestMaster(key, ids, k.masters);
  // No master of them names the key: nothing to converge on.
  if (!newest) throw splitKeyError(key, ids);
  if (range !== undefined && (newest.id < range.min || newest.id > range.max)) {
    throw new InvalidIdError(
      `ID ${newest.id} of split key '${key}' in the store is outside this allocator's range ` +
        `[${range.min}, ${range.max}]; the key gets no other ID`,
    );
  }
  logSplit(key, ids, newest.id);
  return { kind: "joinSplit", id: newest.id, mod: newest.mod };
}

/** Runs the acquisition protocol for `req` (see the module doc). */
export async function acquire(ctx: EtcdContext, req: AcquireRequest): Promise<AcquireResult> {
  const { key, signal } = req;
  const { layout } = ctx;
  const refKey = layout.refKey(key, ctx.node);
  const k: Knowledge = {
    masters: new Map(),
    excluded: new Set(),
    owners: new Map(),
    hint: req.hint ? { id: req.hint.id, version: req.hint.version } : undefined,
  };
  const mutexes = mutexGuards(ctx, key);
  let leaseRetries = 1;
  if (req.trail?.unconfirmed) await recognizeCreate(ctx, req, req.trail);

  for (let round = 0; round < MAX_ACQUIRE_ROUNDS; round++) {
    signal.throwIfAborted();
    const p = plan(k, key, req, layout);
    if (p.kind === "read" || p.kind === "readOwner" || p.kind === "readMasters") {
      await readPhase(ctx, k, key, p, req);
      // Reads are bounded on their own (one per key read); only transactions count as rounds.
      round--;
      continue;
    }
    const lease = await ctx.leases.leaseFor(refKey, signal);
    const guards = mutexes(p.id);
    const txn = writeTxn(layout, k, key, p, put(refKey, String(p.id), lease), guards);
    let res: TxnResult;
    const creates = p.kind === "new" || p.kind === "recreate";
    if (creates && req.trail) req.trail.unconfirmed = { id: p.id };
    try {
      if (req.roundTrips) req.roundTrips.count++;
      res = await ctx.txns.run("acquire", txn, signal);
    } catch (err) {
      if (err instanceof LeaseNotFound && leaseRetries-- > 0) {
        // Refused whole: nothing landed.
        if (req.trail) req.trail.unconfirmed = undefined;
        ctx.leases.lost(lease, "etcd refused a write with it (lease not found)");
        round--;
        continue;
      }
      throw err;
    }
    if (req.trail) req.trail.unconfirmed = undefined;
    const done = (creates ? ownResentCreate(key, p.id, refKey, res) : undefined) ??
      settle(k, layout, key, p, guards, res);
    if (done?.created && req.trail) req.trail.created = done.id;
    if (done !== undefined) return done;
  }
  throw new ConflictError(
    `could not acquire key '${key}' in ${MAX_ACQUIRE_ROUNDS} transactions (store changing under us)`,
  );
}

/**
 * Whether the create of `trail.unconfirmed` (whose answer was lost) landed: the master names the
 * key and was created by the transaction that last put this node's reference (see the module
 * doc). Records it in `trail.created`; clears `unconfirmed` either way.
 */
async function recognizeCreate(
  ctx: EtcdContext,
  req: AcquireRequest,
  trail: AttemptTrail,
): Promise<void> {
  const { client, layout } = ctx;
  const { id } = trail.unconfirmed!;
  if (req.roundTrips) req.roundTrips.count++;
  const res = await client.call(
    "read own create",
    req.signal,
    (o) =>
      client.raw.kv.txn({
        success: [read(layout.masterKey(id)), read(layout.refKey(req.key, ctx.node))],
      }, o),
  );
  trail.unconfirmed = undefined;
  const [master] = kvsAt(res.responses, 0);
  const [ref] = kvsAt(res.responses, 1);
  if (createdWith(master, ref, req.key)) trail.created = id;
}

/**
 * Whether `master` names `key` and was created by the transaction that last put `ref`, this
 * node's reference (see the module doc).
 */
function createdWith(
  master: IKeyValue | undefined,
  ref: IKeyValue | undefined,
  key: string,
): boolean {
  if (master === undefined || ref === undefined) return false;
  return String(master.create_revision) === String(ref.mod_revision) &&
    strictText(master.value) === key;
}

/**
 * A create (`new`, `recreate`) of `id` refused because the client resent it after its first send
 * landed (the answer was lost with the connection): the failure branch's read shows the master
 * created together with this node's reference `refKey`. The first send did all this round asked,
 * so the key is this call's creation.
 */
function ownResentCreate(
  key: string,
  id: number,
  refKey: string,
  res: TxnResult,
): AcquireResult | undefined {
  if (res.succeeded) return undefined;
  const [master] = kvsAt(res.responses, 1);
  const ref = kvsAt(res.responses, 0).find((kv) => strictText(kv.key) === refKey);
  if (!createdWith(master, ref, key)) return undefined;
  return { id, created: true, version: String(master!.mod_revision) };
}

/**
 * Reads what a read plan needs: the references of the key (`read`) or of the key its candidate's
 * master names (`readOwner`), or the masters of a split key's IDs (`readMasters`).
 */
async function readPhase(
  ctx: EtcdContext,
  k: Knowledge,
  key: string,
  p: ReadPlan,
  req: AcquireRequest,
): Promise<void> {
  if (p.kind !== "readMasters") return await readReferences(ctx, k, key, p, req);
  if (req.roundTrips) req.roundTrips.count++;
  for (const [id, m] of await readMasters(ctx, p.ids, req.signal)) k.masters.set(id, m);
}

/** Reads the references of the key (`read`) or of the key its candidate's master names. */
async function readReferences(
  ctx: EtcdContext,
  k: Knowledge,
  key: string,
  p: Extract<Plan, { kind: "read" | "readOwner" }>,
  req: AcquireRequest,
): Promise<void> {
  const { client, layout } = ctx;
  const of = p.kind === "read" ? key : p.owner;
  const prefix = layout.refPrefix(of);
  if (req.roundTrips) req.roundTrips.count++;
  const res = await client.call(
    "read references",
    req.signal,
    (o) => client.raw.kv.range({ ...prefixRange(prefix + "/") }, o),
  );
  const snapshot = snapshotOf(prefix, res.kvs, String(res.header.revision));
  if (p.kind === "read") k.snapshot = snapshot;
  else k.owners.set(p.owner, snapshot);
}

/** Reads the masters of `ids` in one request. */
async function readMasters(
  ctx: EtcdContext,
  ids: readonly number[],
  signal: AbortSignal,
): Promise<Map<number, MasterState>> {
  const { client, layout } = ctx;
  const res = await client.call(
    "read masters",
    signal,
    (o) => client.raw.kv.txn({ success: ids.map((id) => read(layout.masterKey(id))) }, o),
  );
  const out = new Map<number, MasterState>();
  ids.forEach((id, i) => {
    const kv = kvsAt(res.responses, i)[0];
    out.set(id, kv ? readMaster(kv.value, String(kv.mod_revision)) : null);
  });
  return out;
}

/**
 * The guarded transaction of a write plan, which puts `putRef` (this node's reference): its
 * failure branch reads what the next round needs (the key's references, the master, the mutexes).
 */
export function writeTxn(
  layout: EtcdLayout,
  k: Knowledge,
  key: string,
  p: WritePlan,
  putRef: IRequestOp,
  guards: readonly MutexGuard[],
): TxnRequest {
  const masterKey = layout.masterKey(p.id);
  const range = prefixRange(layout.refPrefix(key) + "/");
  let compare: ICompare[];
  let success: IRequestOp[];
  switch (p.kind) {
    case "new":
      compare = [
        absent(masterKey),
        k.snapshot ? unchangedSince(range, k.snapshot.revision) : absent(range),
      ];
      success = [put(masterKey, key), putRef];
      break;
    case "recreate":
      compare = [absent(masterKey), unchangedSince(range, k.snapshot!.revision)];
      success = [put(masterKey, key), putRef];
      break;
    case "repair":
      // The references agree on this ID and nothing changed since: the master is theirs.
      compare = [modIs(masterKey, p.mod), unchangedSince(range, k.snapshot!.revision)];
      if (p.owner) compare.push(unchangedSince(p.owner.range, p.owner.revision));
      success = [put(masterKey, key), putRef];
      break;
    case "existing":
      compare = [valueIs(masterKey, key)];
      success = [agreementLadder(range, p.id, [putRef], k.snapshot)];
      break;
    case "joinSplit":
      // The split as read, and the master chosen from it, must still be there.
      compare = [modIs(masterKey, p.mod), unchangedSince(range, k.snapshot!.revision)];
      success = [putRef];
      break;
  }
  return {
    compare: [...compare, ...guards.map((g) => g.compare())],
    success,
    failure: [read(range), read(masterKey), ...guards.map((g) => g.read())],
  };
}

/**
 * What a write's response means: the key's ID (`AcquireResult`), or `undefined` after recording
 * in `k` what the failure (or the ladder's last step) read, for the next round. Throws
 * {@linkcode KeyLockedError} when a Cilium mutex refused the write.
 */
export function settle(
  k: Knowledge,
  layout: EtcdLayout,
  key: string,
  p: WritePlan,
  guards: readonly MutexGuard[],
  res: TxnResult,
): AcquireResult | undefined {
  const { revision } = res;
  const refPrefix = layout.refPrefix(key);
  if (res.succeeded && p.kind !== "existing") {
    if (p.kind === "repair") {
      log.warning("repaired the master of ID {id} for {key} from its live references", {
        id: p.id,
        key,
      });
    }
    if (p.kind === "joinSplit") return { id: p.id, created: false, version: p.mod };
    return { id: p.id, created: p.kind !== "repair", version: revision };
  }
  if (res.succeeded) {
    const outcome = ladderOutcome(res.responses[0]);
    if (outcome.applied) {
      const m = k.masters.get(p.id);
      const version = m ? m.mod : k.hint?.id === p.id ? k.hint.version : undefined;
      return { id: p.id, created: false, version };
    }
    k.snapshot = snapshotOf(refPrefix, outcome.kvs ?? [], revision);
    return undefined;
  }
  learn(k, refPrefix, p.id, key, res.responses, revision);
  const held = guards.flatMap((g, i) => g.learn(kvsAt(res.responses, 2 + i), revision));
  if (held.length > 0) throw new KeyLockedError(`key '${key}' (ID ${p.id})`, held);
  // A candidate that is still free lost only to the reference guard: it stays a good pick.
  if (p.kind === "new" && k.masters.get(p.id) !== null) k.excluded.add(p.id);
  return undefined;
}

/**
 * The Cilium mutexes a write of `key` with some ID must find free: the key's allocation mutex and
 * the ID's GC mutex (none when the backend was told no Cilium node writes here). One guard per
 * path for the whole call, so that what a failed round learned carries over.
 */
export function mutexGuards(ctx: EtcdContext, key: string): (id: number) => MutexGuard[] {
  if (!ctx.ciliumLocks) return () => [];
  const keyGuard = new MutexGuard(ctx.layout.keyLockPath(key));
  const idGuards = new Map<number, MutexGuard>();
  return (id) => {
    let idGuard = idGuards.get(id);
    if (!idGuard) idGuards.set(id, idGuard = new MutexGuard(ctx.layout.idLockPath(id)));
    return [keyGuard, idGuard];
  };
}

/** Records what a failure branch `[read(range), read(id/<id>), …]` returned. */
function learn(
  k: Knowledge,
  refPrefix: string,
  id: number,
  key: string,
  responses: IResponseOp[],
  revision: string,
): void {
  k.snapshot = snapshotOf(refPrefix, kvsAt(responses, 0), revision);
  const master = kvsAt(responses, 1)[0];
  const state: MasterState = master ? readMaster(master.value, String(master.mod_revision)) : null;
  k.masters.set(id, state);
  // A master of this very key that lost nothing but a race is the one to reuse.
  if (state !== null && state.value === key) k.hint = { id, version: state.mod };
}

/** A master's value as read: its text, or `corrupt` when it cannot be any key. */
export function readMaster(bytes: Uint8Array, mod: string): NonNullable<MasterState> {
  const value = strictText(bytes);
  return { value: value ?? "", mod, corrupt: !value };
}
