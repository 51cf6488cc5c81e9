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
 *
 * @example One acquisition through a session (the allocator normally does this)
 * ```ts ignore
 * const { id, created } = await acquire(core, {
 *   key: "k8s:app=web;",
 *   pickCandidate: (exclude) => (exclude.has(300) ? undefined : 300),
 *   signal: AbortSignal.timeout(5_000),
 * });
 * ```
 *
 * @module
 */
import type { IResponseOp, ITxnResponse } from "etcd3";
import type { AcquireRequest, AcquireResult } from "../../allocator/backend.ts";
import { ConflictError, PoolExhaustedError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { LeaseNotFound } from "./client.ts";
import type { SessionCore } from "./core.ts";
import {
  absent,
  agreementLadder,
  type ByteRange,
  kvsAt,
  ladderOutcome,
  prefixRange,
  put,
  read,
  type RefSnapshot,
  snapshotOf,
  text,
  unchangedSince,
  valueIs,
} from "./txn.ts";

const log = idallocLogger("etcd", "acquire");

/** Transactions one `acquire` may spend before giving up with a {@linkcode ConflictError}. */
export const MAX_ACQUIRE_ROUNDS = 3;

/** A master as last read: absent (`null`) or its value and mod revision. */
type MasterState = { readonly value: string; readonly mod: string } | null;

type Plan =
  | { readonly kind: "read" }
  | { readonly kind: "new"; readonly id: number }
  | { readonly kind: "existing"; readonly id: number }
  | { readonly kind: "recreate"; readonly id: number };

/** Per-call knowledge gathered from failed rounds. */
interface Knowledge {
  snapshot?: RefSnapshot;
  readonly masters: Map<number, MasterState>;
  /** IDs that cannot be this key's new master (taken by another key, or lost a race). */
  readonly excluded: Set<number>;
  hint?: { readonly id: number; readonly version?: string };
}

function agreedId(snapshot: RefSnapshot, key: string): number | undefined {
  const ids = new Set<number>();
  for (const ref of snapshot.exact) if (ref.id !== undefined) ids.add(ref.id);
  if (ids.size > 1) {
    log.error("references of key {key} disagree: {ids}", { key, ids: [...ids] });
    throw new ConflictError(
      `references of key '${key}' name different IDs (${[...ids].join(", ")}); refusing to add one`,
    );
  }
  return ids.size === 1 ? [...ids][0] : undefined;
}

function plan(k: Knowledge, key: string, req: AcquireRequest): Plan {
  const agreed = k.snapshot ? agreedId(k.snapshot, key) : undefined;
  if (agreed !== undefined) {
    // The key is live under `agreed`: join it; re-create its master only if it is gone.
    return k.masters.get(agreed) === null
      ? { kind: "recreate", id: agreed }
      : { kind: "existing", id: agreed };
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

/** Runs the acquisition protocol for `req` (see the module doc). */
export async function acquire(core: SessionCore, req: AcquireRequest): Promise<AcquireResult> {
  const { key, signal } = req;
  const { layout, client } = core;
  const refPrefix = layout.refPrefix(key);
  const refKey = layout.refKey(key, core.node);
  const range: ByteRange = prefixRange(refPrefix + "/");
  const k: Knowledge = {
    masters: new Map(),
    excluded: new Set(),
    hint: req.hint ? { id: req.hint.id, version: req.hint.version } : undefined,
  };
  let leaseRetries = 1;

  for (let round = 0; round < MAX_ACQUIRE_ROUNDS; round++) {
    signal.throwIfAborted();
    const p = plan(k, key, req);
    if (p.kind === "read") {
      const res = await client.call(
        "read references",
        signal,
        (o) => client.raw.kv.range({ ...range }, o),
      );
      k.snapshot = snapshotOf(refPrefix, res.kvs, String(res.header.revision));
      continue;
    }
    const masterKey = layout.masterKey(p.id);
    const lease = await core.leases.leaseFor(refKey, signal);
    const putRef = put(refKey, String(p.id), lease);
    let txn;
    switch (p.kind) {
      case "new":
        txn = {
          compare: [
            absent(masterKey),
            k.snapshot ? unchangedSince(range, k.snapshot.revision) : absent(range),
          ],
          success: [put(masterKey, key), putRef],
          failure: [read(range), read(masterKey)],
        };
        break;
      case "recreate":
        txn = {
          compare: [absent(masterKey), unchangedSince(range, k.snapshot!.revision)],
          success: [put(masterKey, key), putRef],
          failure: [read(range), read(masterKey)],
        };
        break;
      case "existing":
        txn = {
          compare: [valueIs(masterKey, key)],
          success: [agreementLadder(range, p.id, [putRef], k.snapshot)],
          failure: [read(range), read(masterKey)],
        };
        break;
    }
    let res: ITxnResponse;
    try {
      res = await client.call("acquire", signal, (o) => client.raw.kv.txn(txn, o));
    } catch (err) {
      if (err instanceof LeaseNotFound && leaseRetries-- > 0) {
        core.leases.lost(lease, "etcd refused a write with it (lease not found)");
        round--;
        continue;
      }
      throw err;
    }
    const revision = String(res.header.revision);

    if (res.succeeded && p.kind !== "existing") {
      return { id: p.id, created: p.kind === "new" || p.kind === "recreate", version: revision };
    }
    if (res.succeeded) {
      const outcome = ladderOutcome(res.responses[0]);
      if (outcome.applied) {
        const m = k.masters.get(p.id);
        const version = m ? m.mod : k.hint?.id === p.id ? k.hint.version : undefined;
        return { id: p.id, created: false, version };
      }
      k.snapshot = snapshotOf(refPrefix, outcome.kvs ?? [], revision);
      continue;
    }
    learn(k, refPrefix, p.id, key, res.responses, revision);
    // A candidate that is still free lost only to the reference guard: it stays a good pick.
    if (p.kind === "new" && k.masters.get(p.id) !== null) k.excluded.add(p.id);
  }
  throw new ConflictError(
    `could not acquire key '${key}' in ${MAX_ACQUIRE_ROUNDS} transactions (store changing under us)`,
  );
}

/** Records what a failure branch `[read(range), read(id/<id>)]` returned. */
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
  const state: MasterState = master
    ? { value: text(master.value), mod: String(master.mod_revision) }
    : null;
  k.masters.set(id, state);
  // A master of this very key that lost nothing but a race is the one to reuse.
  if (state !== null && state.value === key) k.hint = { id, version: state.mod };
}
