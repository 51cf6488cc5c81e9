/**
 * Re-creation of vanished masters and references of held keys (Cilium's `UpdateKey` in the
 * local-key sync), batched: one read transaction and one write transaction per
 * {@linkcode ENSURE_BATCH} keys, each key's write guarded on its own in a nested transaction.
 *
 * A reference is re-put when it is missing, names another ID, or sits on a lease that is not the
 * one this session holds for it (Cilium's `UpdateIfDifferent` lease rule: after a lease was lost
 * and replaced, surviving copies must move to the live lease).
 *
 * @example
 * ```ts ignore
 * // ignored: needs a session's context on a running etcd (tests/conformance/key_side.test.ts)
 * const [report] = await ensure(ctx, [{ key: "k8s:app=web;", id: 300 }], signal);
 * // { key: "k8s:app=web;", id: 300, master: "ok", reference: "recreated" }
 * ```
 *
 * @module
 */
import type { IRequestOp } from "../../deps/etcd3.ts";
import type { EnsureReport, HeldKey } from "../../allocator/backend.ts";
import { idallocLogger } from "../../log.ts";
import { mutexGuards, readMaster } from "./acquire.ts";
import { LeaseNotFound } from "./client.ts";
import type { EtcdContext } from "./context.ts";
import { batches } from "../shared/batching.ts";
import { BATCH_BYTES, ENSURE_BATCH, KEY_COPIES_PER_TXN, utf8Length } from "./limits.ts";
import {
  absent,
  agreementLadder,
  kvsAt,
  ladderOutcome,
  modIs,
  type MutexGuard,
  nested,
  prefixRange,
  put,
  read,
  snapshotOf,
  text,
  unchangedSince,
  valueIs,
} from "./txn.ts";

const log = idallocLogger("etcd", "ensure");

/** Passes over keys whose guarded write lost a race before they are reported as conflicts. */
const ENSURE_PASSES = 2;

interface Pending {
  readonly index: number;
  readonly held: HeldKey;
  /** The Cilium mutexes its writes must find free (kept across passes: see `MutexGuard`). */
  readonly guards: MutexGuard[];
}

/** Runs `ensure` for `held` (see the module doc); one report per key, in order. */
export async function ensure(
  ctx: EtcdContext,
  held: readonly HeldKey[],
  signal: AbortSignal,
): Promise<EnsureReport[]> {
  const reports: EnsureReport[] = new Array(held.length);
  const all: Pending[] = held.map((h, index) => ({
    index,
    held: h,
    guards: mutexGuards(ctx, h.key)(h.id),
  }));
  // Each key's write carries its bytes about as often as an acquire does.
  const weight = (p: Pending) => KEY_COPIES_PER_TXN * utf8Length(p.held.key) + 512;
  for (const batch of batches(all, [ENSURE_BATCH, BATCH_BYTES], (p) => [1, weight(p)])) {
    let pending = batch;
    let leaseRetries = 1;
    for (let pass = 0; pending.length > 0; pass++) {
      signal.throwIfAborted();
      try {
        pending = await ensurePass(ctx, pending, reports, signal, pass + 1 >= ENSURE_PASSES);
      } catch (err) {
        if (!(err instanceof LeaseNotFound) || leaseRetries-- <= 0) throw err;
        pass--;
      }
    }
  }
  return reports;
}

/** One read + one write; returns the keys whose guarded write lost a race (to try again). */
async function ensurePass(
  ctx: EtcdContext,
  batch: Pending[],
  reports: EnsureReport[],
  signal: AbortSignal,
  last: boolean,
): Promise<Pending[]> {
  const { client, layout, node, leases } = ctx;
  const reads: IRequestOp[] = [];
  // Each key's read also covers the Cilium mutexes its writes would check: a key that needs no
  // write is proven only while no Cilium node is between the steps of allocating it (its master
  // may already exist, its reference not yet), so a held mutex makes the key `busy` either way.
  const stride = 2 + (batch[0]?.guards.length ?? 0);
  for (const { held, guards } of batch) {
    reads.push(read(layout.masterKey(held.id)));
    reads.push(read(prefixRange(layout.refPrefix(held.key) + "/")));
    reads.push(...guards.map((g) => g.read()));
  }
  const snap = await client.call(
    "ensure read",
    signal,
    (o) => client.raw.kv.txn({ success: reads }, o),
  );
  const revision = String(snap.header.revision);

  const writes: IRequestOp[] = [];
  const planned: Array<{ p: Pending; master: "ok" | "recreated"; ref: boolean; lease: string }> =
    [];
  for (const [i, p] of batch.entries()) {
    const { key, id } = p.held;
    const masterKey = layout.masterKey(id);
    const refPrefix = layout.refPrefix(key);
    const refKey = layout.refKey(key, node);
    const range = prefixRange(refPrefix + "/");
    const masterKv = kvsAt(snap.responses, stride * i)[0];
    const refs = snapshotOf(refPrefix, kvsAt(snap.responses, stride * i + 1), revision);
    const locked = p.guards.flatMap((g, j) =>
      g.learn(kvsAt(snap.responses, stride * i + 2 + j), revision)
    );
    if (locked.length > 0) {
      log.info("held key {key} (ID {id}) is locked by a Cilium node; not re-checked now", {
        key,
        id,
        locks: locked,
      });
      reports[p.index] = { key, id, master: "busy", reference: "skipped" };
      continue;
    }

    // An unreadable master (empty, not UTF-8) names nobody: it is repaired, as a missing one is.
    const master = masterKv ? readMaster(masterKv.value, String(masterKv.mod_revision)) : undefined;
    const masterState = !master
      ? "missing"
      : master.corrupt
      ? "corrupt"
      : master.value === key
      ? "ok"
      : "conflict";
    // A reference without a lease is garbage and says nothing (see `agreedId`).
    const disagreeing = refs.exact.filter((r) =>
      r.id !== undefined && r.id !== id && r.lease !== "0"
    );
    if (masterState === "conflict" || disagreeing.length > 0) {
      log.warning("held key {key} (ID {id}) now belongs elsewhere; not re-creating it", {
        key,
        id,
        master: masterKv ? text(masterKv.value) : undefined,
        refs: disagreeing.map((r) => r.value),
      });
      reports[p.index] = { key, id, master: "conflict", reference: "skipped" };
      continue;
    }
    const lease = await leases.leaseFor(refKey, signal);
    const own = refs.exact.find((r) => r.etcdKey === refKey);
    const refOk = own !== undefined && own.id === id && own.lease === lease;
    if (masterState === "ok" && refOk) {
      reports[p.index] = { key, id, master: "ok", reference: "ok" };
      continue;
    }
    const ops = refOk ? [] : [put(refKey, String(id), lease)];
    const guarded = p.guards.map((g) => g.compare());
    const guardReads = p.guards.map((g) => g.read());
    if (masterState === "missing" || masterState === "corrupt") {
      // Re-create only if the ID is still free (or its unreadable master unchanged) and no
      // reference of the key appeared meanwhile.
      const free = master ? modIs(masterKey, master.mod) : absent(masterKey);
      writes.push(nested(
        [free, unchangedSince(range, revision), ...guarded],
        [put(masterKey, key), ...ops],
        guardReads,
      ));
      planned.push({ p, master: "recreated", ref: !refOk, lease });
    } else {
      writes.push(nested(
        [valueIs(masterKey, key), ...guarded],
        [agreementLadder(range, id, ops, refs)],
        guardReads,
      ));
      planned.push({ p, master: "ok", ref: true, lease });
    }
  }
  if (writes.length === 0) return [];

  let res;
  try {
    res = await client.call(
      "ensure write",
      signal,
      (o) => client.raw.kv.txn({ success: writes }, o),
    );
  } catch (err) {
    if (err instanceof LeaseNotFound) await leases.verify(planned.map((pl) => pl.lease), signal);
    throw err;
  }
  const retry: Pending[] = [];
  for (const [i, pl] of planned.entries()) {
    const { key, id } = pl.p.held;
    const txn = res.responses[i]?.response_txn;
    const applied = txn?.succeeded === true &&
      (pl.master === "recreated" || ladderOutcome(txn.responses[0]).applied);
    const locks = txn?.succeeded === false
      ? pl.p.guards.flatMap((g, j) => g.learn(kvsAt(txn.responses, j), String(res.header.revision)))
      : [];
    if (locks.length > 0) {
      log.info("held key {key} (ID {id}) is locked by a Cilium node; not re-checked now", {
        key,
        id,
        locks,
      });
      reports[pl.p.index] = { key, id, master: "busy", reference: "skipped" };
    } else if (applied) {
      if (pl.master === "recreated") {
        log.warning("re-created missing master key of {key} (ID {id})", { key, id });
      }
      if (pl.ref) log.info("re-created reference of {key} (ID {id})", { key, id });
      reports[pl.p.index] = { key, id, master: pl.master, reference: pl.ref ? "recreated" : "ok" };
    } else if (last) {
      reports[pl.p.index] = { key, id, master: "conflict", reference: "skipped" };
    } else {
      retry.push(pl.p);
    }
  }
  return retry;
}
