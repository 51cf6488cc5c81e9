/**
 * Re-creation of vanished masters and references of held keys (Cilium's `UpdateKey` in the
 * local-key sync), batched: one read transaction and one write transaction per
 * {@linkcode ENSURE_BATCH} keys, each key's write guarded on its own in a nested transaction.
 *
 * Each pass goes read → classify → plan → apply: {@linkcode classify} judges a key from its read
 * alone, {@linkcode plan} turns a key that needs a write into its guarded nested transaction, and
 * {@linkcode settle} reads what became of it; the three work on plain data.
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
import type { IKeyValue, IRequestOp, ITxnResponse } from "../../deps/etcd3.ts";
import type { EnsureReport, HeldKey } from "../../allocator/backend.ts";
import { idallocLogger } from "../../log.ts";
import { mutexGuards, readMaster } from "./acquire.ts";
import { LeaseNotFound } from "./client.ts";
import type { EtcdContext } from "./context.ts";
import type { EtcdLayout } from "./layout.ts";
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
  type RefSnapshot,
  snapshotOf,
  text,
  unchangedSince,
  valueIs,
} from "./txn.ts";

const log = idallocLogger("etcd", "ensure");

/** Passes over keys whose guarded write lost a race before they are reported as conflicts. */
const ENSURE_PASSES = 2;

/** A held key on its way through the passes. */
export interface Pending {
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

/** What one read transaction says about one held key. */
export interface KeyRead {
  /** Its master, as stored (`undefined`: absent). */
  readonly master: IKeyValue | undefined;
  /** Its references (exact matching applied). */
  readonly refs: RefSnapshot;
  /** Keys of the Cilium mutexes its writes must find free that are held (empty: none). */
  readonly locked: readonly string[];
}

/** What a held key needs, judged from its read alone. */
export type Verdict =
  /** A Cilium node is between the steps of allocating it: not re-checked now. */
  | { readonly kind: "busy"; readonly locks: readonly string[] }
  /** Its master or a live reference names something else: nothing is written. */
  | { readonly kind: "conflict"; readonly master?: string; readonly refs: readonly string[] }
  /**
   * Its master is this key's, or may be re-created (`missing`, or `corrupt`: it names nobody);
   * whether its own reference is right depends on the lease it should be on.
   */
  | {
    readonly kind: "check";
    readonly master: "ok" | "missing" | "corrupt";
    /** The master's mod revision (absent for a missing one). */
    readonly masterMod?: string;
  };

/** A key whose write goes into the pass's transaction. */
export interface Planned {
  readonly p: Pending;
  /** The nested transaction that writes it. */
  readonly op: IRequestOp;
  /** `recreated`: the op re-creates the master (and the reference when `ref`). */
  readonly master: "ok" | "recreated";
  /** Whether the op re-puts this node's reference. */
  readonly ref: boolean;
  /** The lease the reference goes on. */
  readonly lease: string;
}

/** One read + one write; returns the keys whose guarded write lost a race (to try again). */
async function ensurePass(
  ctx: EtcdContext,
  batch: Pending[],
  reports: EnsureReport[],
  signal: AbortSignal,
  last: boolean,
): Promise<Pending[]> {
  const { layout, node, leases } = ctx;
  const reads = await readBatch(ctx, batch, signal);
  const planned: Planned[] = [];
  for (const [i, p] of batch.entries()) {
    const verdict = classify(p.held, reads[i]);
    if (verdict.kind !== "check") {
      reports[p.index] = verdict.kind === "busy"
        ? busy(p.held, verdict.locks)
        : conflict(p.held, verdict);
      continue;
    }
    const lease = await leases.leaseFor(layout.refKey(p.held.key, node), signal);
    const step = plan(layout, node, p, reads[i], verdict, lease);
    if ("op" in step) planned.push(step);
    else reports[p.index] = step;
  }
  if (planned.length === 0) return [];
  const res = await applyWrites(ctx, planned, signal);
  const revision = String(res.header.revision);
  const retry: Pending[] = [];
  for (const [i, pl] of planned.entries()) {
    const report = settle(pl, res.responses[i]?.response_txn, revision, last);
    if (report === "retry") retry.push(pl.p);
    else reports[pl.p.index] = report;
  }
  return retry;
}

/**
 * Reads every key of `batch` in one transaction: its master, its reference range and the Cilium
 * mutexes its writes would check (a key that needs no write is proven only while no Cilium node is
 * between the steps of allocating it — its master may already exist, its reference not yet — so a
 * held mutex makes the key `busy` either way). The guards learn what their mutexes hold.
 */
async function readBatch(
  ctx: EtcdContext,
  batch: readonly Pending[],
  signal: AbortSignal,
): Promise<KeyRead[]> {
  const { client, layout } = ctx;
  const reads = batch.flatMap(({ held, guards }) => [
    read(layout.masterKey(held.id)),
    read(prefixRange(layout.refPrefix(held.key) + "/")),
    ...guards.map((g) => g.read()),
  ]);
  const snap = await client.call(
    "ensure read",
    signal,
    (o) => client.raw.kv.txn({ success: reads }, o),
  );
  const revision = String(snap.header.revision);
  const stride = 2 + (batch[0]?.guards.length ?? 0);
  return batch.map(({ held, guards }, i) => ({
    master: kvsAt(snap.responses, stride * i)[0],
    refs: snapshotOf(
      layout.refPrefix(held.key),
      kvsAt(snap.responses, stride * i + 1),
      revision,
    ),
    locked: guards.flatMap((g, j) => g.learn(kvsAt(snap.responses, stride * i + 2 + j), revision)),
  }));
}

/** Judges `held` from its read (see {@linkcode Verdict}). */
export function classify(held: HeldKey, read: KeyRead): Verdict {
  if (read.locked.length > 0) return { kind: "busy", locks: read.locked };
  // An unreadable master (empty, not UTF-8) names nobody: it is repaired, as a missing one is.
  const master = read.master
    ? readMaster(read.master.value, String(read.master.mod_revision))
    : undefined;
  // A reference without a lease is garbage and says nothing (see `agreedId`).
  const disagreeing = read.refs.exact.filter((r) =>
    r.id !== undefined && r.id !== held.id && r.lease !== "0"
  );
  const othersMaster = master !== undefined && !master.corrupt && master.value !== held.key;
  if (othersMaster || disagreeing.length > 0) {
    return {
      kind: "conflict",
      master: read.master ? text(read.master.value) : undefined,
      refs: disagreeing.map((r) => r.value),
    };
  }
  if (master === undefined) return { kind: "check", master: "missing" };
  return { kind: "check", master: master.corrupt ? "corrupt" : "ok", masterMod: master.mod };
}

/**
 * What a key that passed {@linkcode classify} needs, given the lease its reference should be on:
 * nothing (its report), or a guarded write. A master to re-create is put only if the ID is still
 * free (or its unreadable master unchanged) and no reference of the key appeared meanwhile; an
 * intact master's key gets its reference through the agreement ladder.
 */
export function plan(
  layout: EtcdLayout,
  node: string,
  p: Pending,
  read: KeyRead,
  verdict: Extract<Verdict, { kind: "check" }>,
  lease: string,
): Planned | EnsureReport {
  const { key, id } = p.held;
  const masterKey = layout.masterKey(id);
  const refKey = layout.refKey(key, node);
  const range = prefixRange(layout.refPrefix(key) + "/");
  const own = read.refs.exact.find((r) => r.etcdKey === refKey);
  const refOk = own !== undefined && own.id === id && own.lease === lease;
  if (verdict.master === "ok" && refOk) return { key, id, master: "ok", reference: "ok" };
  const ops = refOk ? [] : [put(refKey, String(id), lease)];
  const guarded = p.guards.map((g) => g.compare());
  const guardReads = p.guards.map((g) => g.read());
  if (verdict.master === "ok") {
    const op = nested(
      [valueIs(masterKey, key), ...guarded],
      [agreementLadder(range, id, ops, read.refs)],
      guardReads,
    );
    return { p, op, master: "ok", ref: true, lease };
  }
  const free = verdict.masterMod === undefined
    ? absent(masterKey)
    : modIs(masterKey, verdict.masterMod);
  const op = nested(
    [free, unchangedSince(range, read.refs.revision), ...guarded],
    [put(masterKey, key), ...ops],
    guardReads,
  );
  return { p, op, master: "recreated", ref: !refOk, lease };
}

/** Runs the planned writes in one transaction; a lost lease is verified before it is rethrown. */
async function applyWrites(ctx: EtcdContext, planned: readonly Planned[], signal: AbortSignal) {
  const { client, leases } = ctx;
  try {
    return await client.call(
      "ensure write",
      signal,
      (o) => client.raw.kv.txn({ success: planned.map((pl) => pl.op) }, o),
    );
  } catch (err) {
    if (err instanceof LeaseNotFound) await leases.verify(planned.map((pl) => pl.lease), signal);
    throw err;
  }
}

/**
 * What became of a planned write, from its nested transaction's response: its report, or
 * `retry` when it lost a race and this is not the `last` pass (then it is a conflict). A write
 * refused by a Cilium mutex makes the key `busy`; the guards learn what the failure read.
 */
export function settle(
  pl: Planned,
  txn: ITxnResponse | undefined,
  revision: string,
  last: boolean,
): EnsureReport | "retry" {
  const { key, id } = pl.p.held;
  const locks = txn?.succeeded === false
    ? pl.p.guards.flatMap((g, j) => g.learn(kvsAt(txn.responses, j), revision))
    : [];
  if (locks.length > 0) return busy(pl.p.held, locks);
  const applied = txn?.succeeded === true &&
    (pl.master === "recreated" || ladderOutcome(txn.responses[0]).applied);
  if (!applied) return last ? { key, id, master: "conflict", reference: "skipped" } : "retry";
  if (pl.master === "recreated") {
    log.warning("re-created missing master key of {key} (ID {id})", { key, id });
  }
  if (pl.ref) log.info("re-created reference of {key} (ID {id})", { key, id });
  return { key, id, master: pl.master, reference: pl.ref ? "recreated" : "ok" };
}

function busy({ key, id }: HeldKey, locks: readonly string[]): EnsureReport {
  log.info("held key {key} (ID {id}) is locked by a Cilium node; not re-checked now", {
    key,
    id,
    locks,
  });
  return { key, id, master: "busy", reference: "skipped" };
}

function conflict(
  { key, id }: HeldKey,
  verdict: Extract<Verdict, { kind: "conflict" }>,
): EnsureReport {
  log.warning("held key {key} (ID {id}) now belongs elsewhere; not re-creating it", {
    key,
    id,
    master: verdict.master,
    refs: verdict.refs,
  });
  return { key, id, master: "conflict", reference: "skipped" };
}
