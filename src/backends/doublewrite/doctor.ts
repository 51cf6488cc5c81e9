/**
 * The doctor of a double-write store: each side's own damage (the etcd and Kubernetes doctors),
 * and the **drift** between the sides — what Cilium's operator only counts
 * (`cilium_operator_identity_{kvstore,crd}_only_count`), listed one finding per identity, and
 * repaired on request under each store's own guards.
 *
 * Drift kinds ({@linkcode DRIFT_KINDS}):
 * - `kvstore-only` / `crd-only`: an ID one side has and the other lacks. The repair copies it
 *   across with the side's own allocation path (`acquire` offering that ID alone, then `release`
 *   of the doctor's reference): the ID is created only if it is free there, and never for a label
 *   set that has another ID there (the Kubernetes key claim, etcd's guarded transactions refuse
 *   it), so a copy never gives a label set a second ID and never rewrites anything.
 * - `labels-differ`: one ID, two label sets. `key-split`: one label set whose IDs differ between
 *   the sides (each ID on its side only). Nodes reading different sides answer differently, so a
 *   repair must delete one side's entry: only the entry on the side the mode does **not** read, only
 *   when that side's own GC rule finds it unused (no live reference on that side; on the CRD side
 *   also no `CiliumEndpoint` or slice naming it and no creation or mark within Cilium's heartbeat
 *   timeout), with that side's guarded GC delete; then the read side's entry is copied across as
 *   above. An entry in use is reported with its holders and left: deleting it would change the
 *   identity of an ID a node holds.
 *
 * A label set with several IDs on one side while the other side agrees with one of them is that
 * side's duplicate, which that side's doctor reports; it is not drift.
 *
 * @example The drift of two sides' listings
 * ```ts
 * import assert from "node:assert/strict";
 * import { classifyDrift } from "./doctor.ts";
 * const kvstore = new Map([[256, "a"], [257, "b"], [258, "c"]]);
 * const crd = new Map([[256, "a"], [257, "x"], [259, "c"], [260, "d"]]);
 * assert.deepEqual(classifyDrift(kvstore, crd).map((d) => d.kind), [
 *   "labels-differ",
 *   "key-split",
 *   "crd-only",
 * ]);
 * ```
 *
 * @module
 */
import type {
  Backend,
  BackendSession,
  GcCandidate,
  StoredReference,
} from "../../allocator/backend.ts";
import {
  type DamageFinding,
  type DamageScanOptions,
  decodeToken,
  encodeToken,
  isStoreDoctor,
  shorten,
  type StoreDoctor,
} from "../../allocator/damage.ts";
import { InvalidOptionsError, LiveEntryError, PoolExhaustedError } from "../../errors.ts";
import { z } from "../../deps/zod.ts";
import { idallocLogger } from "../../log.ts";
import { listMasters, withReaders } from "./masters.ts";
import { type DoubleWriteMode, readSideOf, type Side } from "./mode.ts";

const log = idallocLogger("doublewrite");

/** The drift kinds and what each means. */
export const DRIFT_KINDS: Readonly<Record<DriftKind, string>> = {
  "kvstore-only": "an identity on the kvstore (etcd) whose ID has no CiliumIdentity " +
    "(Cilium's operator counts it in cilium_operator_identity_kvstore_only_count)",
  "crd-only": "a CiliumIdentity whose ID has no kvstore master " +
    "(Cilium's operator counts it in cilium_operator_identity_crd_only_count)",
  "labels-differ": "an ID whose kvstore master and CiliumIdentity name different label sets",
  "key-split": "a label set whose ID on the kvstore differs from its ID on the CRDs",
};

/** One of {@linkcode DRIFT_KINDS}. */
export type DriftKind = "kvstore-only" | "crd-only" | "labels-differ" | "key-split";

/** Whether a finding's kind is drift (repaired by copying, not by deleting). */
export function isDriftKind(kind: string): kind is DriftKind {
  return Object.hasOwn(DRIFT_KINDS, kind);
}

/** One drift between the sides, as {@linkcode classifyDrift} finds it. */
export interface Drift {
  /** What kind. */
  readonly kind: DriftKind;
  /** The kvstore's ID, when the kvstore has the identity. */
  readonly kvstoreId?: number;
  /** The kvstore's label set (encoded key) at that ID. */
  readonly kvstoreKey?: string;
  /** The CRD side's ID, when it has the identity. */
  readonly crdId?: number;
  /** The CRD side's label set (encoded key) at that ID. */
  readonly crdKey?: string;
}

function idsByKey(side: ReadonlyMap<number, string>): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const [id, key] of side) out.set(key, [...out.get(key) ?? [], id]);
  return out;
}

/**
 * The drift between two sides' ID → key maps (see the module documentation), ordered by the
 * lowest ID each one names. `countDrift` counts the same IDs as Cilium's operator does; this
 * names them.
 */
export function classifyDrift(
  kvstore: ReadonlyMap<number, string>,
  crd: ReadonlyMap<number, string>,
): Drift[] {
  const out: { at: number; drift: Drift }[] = [];
  const kvByKey = idsByKey(kvstore);
  const crdByKey = idsByKey(crd);
  for (const [id, key] of kvstore) {
    const twin = crd.get(id);
    if (twin !== undefined) {
      if (twin !== key) {
        out.push({
          at: id,
          drift: { kind: "labels-differ", kvstoreId: id, kvstoreKey: key, crdId: id, crdKey: twin },
        });
      }
      continue;
    }
    const there = crdByKey.get(key) ?? [];
    if (there.length === 0) {
      out.push({ at: id, drift: { kind: "kvstore-only", kvstoreId: id, kvstoreKey: key } });
      continue;
    }
    // The label set has other IDs on the CRD side: a split when none of them is on the kvstore
    // too (else this ID is a kvstore duplicate of an agreed identity: the etcd side's business).
    const alone = there.filter((other) => !kvstore.has(other));
    if (alone.length === there.length) {
      const crdId = Math.min(...alone);
      out.push({
        at: Math.min(id, crdId),
        drift: { kind: "key-split", kvstoreId: id, kvstoreKey: key, crdId, crdKey: key },
      });
    }
  }
  for (const [id, key] of crd) {
    if (kvstore.has(id)) continue;
    const there = kvByKey.get(key) ?? [];
    // Splits were named from the kvstore's side; a CRD duplicate is the CRD doctor's.
    if (there.length === 0) {
      out.push({ at: id, drift: { kind: "crd-only", crdId: id, crdKey: key } });
    }
  }
  return out.sort((a, b) => a.at - b.at).map((o) => o.drift);
}

/** The side not read in `mode`. */
function otherSide(side: Side): Side {
  return side === "kvstore" ? "crd" : "kvstore";
}

/** The shape of a drift finding's token payload (checked at the boundary). */
const driftToken = z.object({
  drift: z.enum(["kvstore-only", "crd-only", "labels-differ", "key-split"]),
  kvstoreId: z.number().int().positive().optional(),
  kvstoreKey: z.string().optional(),
  crdId: z.number().int().positive().optional(),
  crdKey: z.string().optional(),
  held: z.array(z.string()).optional(),
});

/** A side's damage finding, wrapped. */
const sideToken = z.object({ side: z.enum(["kvstore", "crd"]), token: z.string() });

/** The token prefix of this store's findings. */
const TOKEN = "doublewrite";

/** Placeholder holder for an entry in use without a live node's reference (Cilium's users). */
export const CILIUM_USE =
  "in use by Cilium (a CiliumEndpoint or slice names it, or new or marked recently)";

/** What the doctor needs of a double-write store (the backend's two sides and its mode). */
export interface DoctorSides {
  /** The mode: its read side is the side a repair keeps. */
  readonly mode: DoubleWriteMode;
  /** The kvstore side. */
  readonly kvstore: Backend;
  /** The CRD side. */
  readonly crd: Backend;
}

/** The ID of a drift on `side` (the entry a repair would delete there). */
function idOn(drift: Drift, side: Side): number | undefined {
  return side === "kvstore" ? drift.kvstoreId : drift.crdId;
}

function describe(drift: Drift, read: Side): { entry: string; reason: string; id: number } {
  const other = otherSide(read);
  const kv = (id?: number, key?: string) => `kvstore ID ${id} = ${shorten(key ?? "")}`;
  const crd = (id?: number, key?: string) => `CRD ID ${id} = ${shorten(key ?? "")}`;
  switch (drift.kind) {
    case "kvstore-only":
      return {
        id: drift.kvstoreId!,
        entry: kv(drift.kvstoreId, drift.kvstoreKey),
        reason: `ID ${drift.kvstoreId} has no CiliumIdentity; --fix copies it to the CRDs`,
      };
    case "crd-only":
      return {
        id: drift.crdId!,
        entry: crd(drift.crdId, drift.crdKey),
        reason: `ID ${drift.crdId} has no kvstore master; --fix copies it to the kvstore`,
      };
    case "labels-differ":
      return {
        id: drift.kvstoreId!,
        entry: `${kv(drift.kvstoreId, drift.kvstoreKey)}; ${crd(drift.crdId, drift.crdKey)}`,
        reason: `ID ${drift.kvstoreId} names different label sets on the two sides; --fix ` +
          `replaces the ${other} side's (the side not read) when nothing uses it there`,
      };
    case "key-split":
      return {
        id: Math.min(drift.kvstoreId!, drift.crdId!),
        entry: `${kv(drift.kvstoreId, drift.kvstoreKey)}; ${crd(drift.crdId, drift.crdKey)}`,
        reason: `the label set is ID ${drift.kvstoreId} on the kvstore and ID ${drift.crdId} ` +
          `on the CRDs; --fix deletes the ${other} side's ID (the side not read) when nothing ` +
          "uses it there, and copies the other across",
      };
  }
}

/**
 * The holders of ID `id` on `side`: the live nodes whose references there name it, or
 * {@linkcode CILIUM_USE} when that side's GC rule finds it in use without one; empty when unused.
 */
function holdersOf(
  id: number,
  refs: readonly StoredReference[],
  candidates: ReadonlyMap<number, GcCandidate>,
): string[] {
  const nodes = refs.filter((r) => r.live && r.id === id).map((r) => r.node);
  if (nodes.length > 0) return [...new Set(nodes)].sort();
  return candidates.get(id)?.inUse === false ? [] : [CILIUM_USE];
}

/** Every candidate of `session`'s GC listing over the IDs `ids`, by ID. */
async function candidatesOf(
  session: BackendSession,
  ids: readonly number[],
  signal: AbortSignal,
): Promise<Map<number, GcCandidate>> {
  const out = new Map<number, GcCandidate>();
  if (ids.length === 0) return out;
  const wanted = new Set(ids);
  const range = { min: Math.min(...ids), max: Math.max(...ids) };
  for await (const c of session.gcList(range, signal)) if (wanted.has(c.id)) out.set(c.id, c);
  return out;
}

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

/**
 * The drift findings of `sides`: read-only sessions on both sides list their identities; a
 * conflict (`labels-differ`, `key-split`) names the holders of the entry a repair would delete.
 */
export async function* findDrift(
  sides: DoctorSides,
  signal: AbortSignal,
): AsyncIterable<DamageFinding> {
  const read = readSideOf(sides.mode);
  const other = otherSide(read);
  const { drifts, holders } = await withReaders(sides, signal, async (kv, crd) => {
    const [kvIds, crdIds] = await Promise.all([listMasters(kv, signal), listMasters(crd, signal)]);
    const drifts = classifyDrift(kvIds, crdIds);
    const conflicts = drifts.filter((d) => d.kind === "labels-differ" || d.kind === "key-split")
      .map((d) => idOn(d, other)!);
    const holders = new Map<number, string[]>();
    if (conflicts.length > 0) {
      const session = other === "kvstore" ? kv : crd;
      const admin = (other === "kvstore" ? sides.kvstore : sides.crd).admin();
      const [refs, candidates] = await Promise.all([
        collect(admin.references(signal)),
        candidatesOf(session, conflicts, signal),
      ]);
      for (const id of conflicts) holders.set(id, holdersOf(id, refs, candidates));
    }
    return { drifts, holders };
  });
  for (const drift of drifts) {
    const { entry, reason, id } = describe(drift, read);
    const held = holders.get(idOn(drift, other) ?? -1) ?? [];
    const payload = {
      drift: drift.kind,
      ...(drift.kvstoreId === undefined ? {} : { kvstoreId: drift.kvstoreId }),
      ...(drift.kvstoreKey === undefined ? {} : { kvstoreKey: drift.kvstoreKey }),
      ...(drift.crdId === undefined ? {} : { crdId: drift.crdId }),
      ...(drift.crdKey === undefined ? {} : { crdKey: drift.crdKey }),
      ...(held.length === 0 ? {} : { held }),
    };
    yield {
      kind: drift.kind,
      entry,
      reason,
      id,
      key: shorten(drift.kvstoreKey ?? drift.crdKey ?? ""),
      ...(held.length === 0 ? {} : { heldBy: held }),
      token: encodeToken(TOKEN, payload),
    };
  }
}

/** The lease TTL of repair sessions unless given. */
const DEFAULT_REPAIR_LEASE_TTL_MS = 60_000;

/** Options of {@linkcode DriftRepairer}. */
export interface DriftRepairOptions {
  /** The lease TTL of its writable sessions, in ms (default 60 s). */
  readonly leaseTtlMs?: number;
}

/**
 * Writable sessions on both sides for repairs, under the backend's node name (opening one under a
 * live node's name is refused: `NodeInUseError`). Each side's session keeps that side's own GC
 * grace (the CRD side's: Cilium's heartbeat timeout), which decides whether an entry is unused.
 */
export class DriftRepairer implements AsyncDisposable {
  readonly #sides: DoctorSides;
  readonly #leaseTtlMs: number;
  readonly #sessions = new Map<Side, Promise<BackendSession>>();

  /**
   * A repairer of `sides`; nothing is opened until the first repair.
   * @param sides the store to repair
   * @param options the repair sessions' lease TTL (default 60 s; on Kubernetes it must be below
   * the heartbeat timeout and at least twice the clock skew, as every writer's)
   */
  constructor(sides: DoctorSides, options: DriftRepairOptions = {}) {
    this.#sides = sides;
    this.#leaseTtlMs = options.leaseTtlMs ?? DEFAULT_REPAIR_LEASE_TTL_MS;
  }

  #session(side: Side, signal: AbortSignal): Promise<BackendSession> {
    let session = this.#sessions.get(side);
    if (session === undefined) {
      const backend = side === "kvstore" ? this.#sides.kvstore : this.#sides.crd;
      session = backend.openSession({
        leaseTtlMs: this.#leaseTtlMs,
        readOnly: false,
        onLeaseReplaced: () => {},
        signal,
      });
      // A failed open is not cached: the next repair tries again.
      session.catch(() => this.#sessions.delete(side));
      this.#sessions.set(side, session);
    }
    return session;
  }

  /**
   * Repairs the drift of `finding` (a token of {@linkcode findDrift}) if the store is still as
   * listed: returns whether it was repaired, `false` when either side changed since. Throws
   * `LiveEntryError` when the entry a repair would delete is in use (as listed, or now), and
   * `InvalidOptionsError` for a token that is not a drift finding of this store.
   */
  async repair(finding: Pick<DamageFinding, "token">, signal: AbortSignal): Promise<boolean> {
    const parsed = driftToken.safeParse(decodeToken(finding.token, TOKEN));
    if (!parsed.success) {
      throw new InvalidOptionsError("not a drift finding of a double-write store", {
        cause: parsed.error,
      });
    }
    const t = parsed.data;
    const drift: Drift = {
      kind: t.drift,
      ...(t.kvstoreId === undefined ? {} : { kvstoreId: t.kvstoreId }),
      ...(t.kvstoreKey === undefined ? {} : { kvstoreKey: t.kvstoreKey }),
      ...(t.crdId === undefined ? {} : { crdId: t.crdId }),
      ...(t.crdKey === undefined ? {} : { crdKey: t.crdKey }),
    };
    const read = readSideOf(this.#sides.mode);
    const other = otherSide(read);
    const { entry } = describe(drift, read);
    if (t.held !== undefined) throw new LiveEntryError(entry, t.held);
    if (!await this.#unchanged(drift, signal)) return false;
    switch (drift.kind) {
      case "kvstore-only":
        return await this.#copy("crd", drift.kvstoreKey!, drift.kvstoreId!, signal);
      case "crd-only":
        return await this.#copy("kvstore", drift.crdKey!, drift.crdId!, signal);
      default: {
        // A conflict: the side not read gives its entry up, if unused, for the read side's.
        const doomed = idOn(drift, other)!;
        if (!await this.#deleteUnused(other, doomed, entry, signal)) return false;
        const key = read === "kvstore" ? drift.kvstoreKey! : drift.crdKey!;
        return await this.#copy(other, key, idOn(drift, read)!, signal);
      }
    }
  }

  /** Whether both sides still hold what `drift` says (each side's ID read once more). */
  async #unchanged(drift: Drift, signal: AbortSignal): Promise<boolean> {
    const [kv, crd] = await Promise.all([
      this.#session("kvstore", signal),
      this.#session("crd", signal),
    ]);
    const check = async (session: BackendSession, id: number | undefined, key?: string) =>
      id === undefined || await session.getById(id, signal) === key;
    const absent = async (session: BackendSession, id: number | undefined) =>
      id === undefined || await session.getById(id, signal) === undefined;
    switch (drift.kind) {
      case "kvstore-only":
        return await check(kv, drift.kvstoreId, drift.kvstoreKey) &&
          await absent(crd, drift.kvstoreId);
      case "crd-only":
        return await check(crd, drift.crdId, drift.crdKey) && await absent(kv, drift.crdId);
      default:
        return await check(kv, drift.kvstoreId, drift.kvstoreKey) &&
          await check(crd, drift.crdId, drift.crdKey);
    }
  }

  /**
   * Deletes ID `id` on `side` if that side's GC rule finds it unused now, with its guarded delete.
   * Throws `LiveEntryError` when it is in use.
   */
  async #deleteUnused(side: Side, id: number, entry: string, signal: AbortSignal) {
    const session = await this.#session(side, signal);
    const candidate = (await candidatesOf(session, [id], signal)).get(id);
    if (candidate === undefined) return false;
    if (candidate.inUse) {
      const admin = (side === "kvstore" ? this.#sides.kvstore : this.#sides.crd).admin();
      const refs = await collect(admin.references(signal));
      throw new LiveEntryError(entry, holdersOf(id, refs, new Map([[id, candidate]])));
    }
    const deleted = await session.gcDelete(candidate, signal);
    // The copy that follows must not answer from a view that still shows the deleted entry (a
    // Kubernetes session's informer may not have seen the deletion yet, and would join it): it
    // runs on a session opened after the delete, whose first list cannot show it.
    this.#sessions.delete(side);
    await session.close();
    return deleted;
  }

  /**
   * Creates ID `id` for `key` on `side` through that side's allocation path (offering that ID
   * alone), then drops the doctor's reference. Returns whether the side now maps `id` to `key`:
   * `false` when the ID was taken there meanwhile or the label set has another ID there.
   */
  async #copy(side: Side, key: string, id: number, signal: AbortSignal): Promise<boolean> {
    const session = await this.#session(side, signal);
    let got: number;
    try {
      got = (await session.acquire({
        key,
        signal,
        pickCandidate: (exclude) => (exclude.has(id) ? undefined : id),
      })).id;
    } catch (err) {
      if (err instanceof PoolExhaustedError) return false;
      throw err;
    }
    await session.release(key, got, signal);
    if (got !== id) {
      log.warning("label set {key} has ID {got} on the {side} side: ID {id} not copied", {
        key,
        got,
        side,
        id,
      });
    }
    return got === id;
  }

  /** Closes the sessions (the doctor's references went with each repair). */
  async [Symbol.asyncDispose](): Promise<void> {
    const sessions = [...this.#sessions.values()];
    this.#sessions.clear();
    await Promise.allSettled(sessions.map(async (s) => (await s).close()));
  }
}

/**
 * A {@linkcode StoreDoctor} over both sides: each side's own damage (its findings' entries say
 * the side; their tokens wrap the side's), then the drift ({@linkcode findDrift}).
 * `removeDamage` hands a side's finding to that side's doctor, and repairs a drift finding with a
 * {@linkcode DriftRepairer} of its own (a caller repairing many opens one and calls
 * {@linkcode DriftRepairer.repair}).
 */
export function bothDoctors(sides: DoctorSides): StoreDoctor {
  const doctorOf = (side: Side): StoreDoctor | undefined => {
    const backend = side === "kvstore" ? sides.kvstore : sides.crd;
    return isStoreDoctor(backend) ? backend : undefined;
  };
  return {
    async *findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding> {
      for (const side of ["kvstore", "crd"] as const) {
        const doctor = doctorOf(side);
        if (doctor === undefined) continue;
        for await (const f of doctor.findDamage(options)) {
          yield {
            ...f,
            entry: `${side} ${f.entry}`,
            token: encodeToken(TOKEN, { side, token: f.token }),
          };
        }
      }
      yield* findDrift(sides, options?.signal ?? new AbortController().signal);
    },
    async removeDamage(finding, options): Promise<boolean> {
      const signal = options?.signal ?? new AbortController().signal;
      const wrapped = sideToken.safeParse(decodeToken(finding.token, TOKEN));
      if (wrapped.success) {
        const doctor = doctorOf(wrapped.data.side);
        if (doctor === undefined) throw new InvalidOptionsError("no doctor on that side");
        return await doctor.removeDamage({ token: wrapped.data.token }, { signal });
      }
      await using repairer = new DriftRepairer(sides);
      return await repairer.repair(finding, signal);
    },
  };
}
