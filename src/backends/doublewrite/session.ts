/**
 * A double-write session: one session on each side (`kvstore`: etcd, `crd`: Kubernetes), driven
 * in Cilium v1.17's order (`pkg/kvstore/allocator/doublewrite`), with each side's own guards
 * doing the guarding. See `./backend.ts` for the rules and the argument for idalloc's guarantees.
 *
 * @module
 */
import type {
  AcquireRequest,
  AcquireResult,
  AttemptTrail,
  BackendEvent,
  BackendSession,
  EnsureReport,
  GcCandidate,
  GcListOptions,
  HeldKey,
  SessionStatus,
} from "../../allocator/backend.ts";
import { ConflictError, PoolExhaustedError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { sleep } from "../../abort.ts";
import { TaskGroup } from "../../task_group.ts";
import { type AttributeSets, type ObservationSink, observe } from "../../telemetry/instruments.ts";
import { countDrift, type DriftCount } from "./drift.ts";
import { DoubleWriteConflictError } from "./errors.ts";
import { deleteBoth, listBoth } from "./gc.ts";
import type { DoubleWriteMode, Side } from "./mode.ts";
import { readSideOf } from "./mode.ts";

const log = idallocLogger("doublewrite");

/** A `pickCandidate` that offers `id` alone (the ID the other side already gave the key). */
function only(id: number): (exclude: ReadonlySet<number>) => number | undefined {
  return (exclude) => (exclude.has(id) ? undefined : id);
}

/** How long the other side's watch waits before it starts again after a failure. */
const REWATCH_MS = 1_000;

/** The two sessions of one double-write session, by side. */
export interface Sides {
  /** The etcd session (Cilium's kvstore). */
  readonly kvstore: BackendSession;
  /** The Kubernetes session (Cilium's CRDs). */
  readonly crd: BackendSession;
}

/** One allocator's sessions on both stores. See the module documentation. */
export class DoubleWriteSession implements BackendSession {
  readonly #mode: DoubleWriteMode;
  readonly #kv: BackendSession;
  readonly #crd: BackendSession;
  /** The side whose answer is the key's ID. */
  readonly #read: BackendSession;
  readonly #readSide: Side;
  readonly #group = new TaskGroup("double-write session");
  /**
   * The side not read, from its watch (ID → key): its IDs are kept out of new candidates, and
   * with {@linkcode DoubleWriteSession.#readKeys} they give the per-side counts.
   */
  #otherKeys = new Map<number, string>();
  /** Whether the other side's watch has listed it once. */
  #otherSynced = false;
  /** The read side, as the allocator's watch of it shows it (ID → key). */
  #readKeys = new Map<number, string>();
  /** Whether the read side's watch has listed it once. */
  #readSynced = false;
  /** The metric source's registration (writable sessions only). */
  #metrics: Disposable | undefined;
  /** IDs a kvstore refusal showed taken there before the watch did (until the watch shows them). */
  readonly #refused = new Set<number>();
  /**
   * The kvstore side's trail, per allocation. The allocation's own trail (from which the core
   * reports `isNew`) is the CRD side's in both read modes: a key is born where it is first
   * written, and the CRD is written first and once per key among idalloc nodes.
   */
  readonly #kvstoreTrails = new WeakMap<AttemptTrail, AttemptTrail>();

  /** Whether master version `a` is newer than `b`: the read side's order, where it has one. */
  readonly newerVersion?: (a: string, b: string) => boolean;

  /**
   * Wraps `sides` (opened by {@linkcode DoubleWriteBackend.openSession}). A writable session
   * watches the side it does not read, to keep that side's IDs out of new candidates.
   */
  constructor(
    mode: DoubleWriteMode,
    sides: Sides,
    writable: boolean,
    attributes?: AttributeSets,
  ) {
    this.#mode = mode;
    this.#kv = sides.kvstore;
    this.#crd = sides.crd;
    this.#readSide = readSideOf(mode);
    this.#read = this.#readSide === "kvstore" ? this.#kv : this.#crd;
    const order = this.#read.newerVersion;
    if (order !== undefined) this.newerVersion = (a, b) => order.call(this.#read, a, b);
    if (writable) {
      this.#group.spawn(this.#watchOther());
      if (attributes !== undefined) {
        this.#metrics = observe({ observe: (sink) => this.#observe(sink, attributes) });
      }
    }
  }

  /**
   * Identities per side and on one side only, as this session's watches see both sides (Cilium
   * operator's counters); `undefined` until both sides were listed once (a writable session's
   * other side is watched from the start; the read side once the allocator watches it).
   */
  driftCount(): DriftCount | undefined {
    if (!this.#readSynced || !this.#otherSynced) return undefined;
    return this.#readSide === "kvstore"
      ? countDrift(this.#readKeys, this.#otherKeys)
      : countDrift(this.#otherKeys, this.#readKeys);
  }

  #observe(sink: ObservationSink, attributes: AttributeSets): void {
    const count = this.driftCount();
    if (count === undefined) return;
    const base = attributes.base;
    sink.add("idalloc.identity.kvstore.total_count", count.kvstore.total, base);
    sink.add("idalloc.identity.kvstore.only_count", count.kvstore.only, base);
    sink.add("idalloc.identity.crd.total_count", count.crd.total, base);
    sink.add("idalloc.identity.crd.only_count", count.crd.only, base);
    sink.add("idalloc.identity.differing_count", count.differing.length, base);
  }

  /**
   * A side's watch as ID → key: each (re)start lists into a fresh map, which replaces the
   * current one at `synced` (so IDs gone while the watch was down leave it); live changes after
   * it apply to the current one. `done` is told the map once listed.
   */
  async *#tracked(
    events: AsyncIterable<BackendEvent>,
    current: () => Map<number, string>,
    listed: (map: Map<number, string>) => void,
  ): AsyncGenerator<BackendEvent> {
    let listing: Map<number, string> | undefined = new Map();
    for await (const ev of events) {
      const map = listing ?? current();
      if (ev.type === "upsert") map.set(ev.id, ev.key);
      else if (ev.type === "delete") map.delete(ev.id);
      else if (listing !== undefined) {
        listed(listing);
        listing = undefined;
      }
      yield ev;
    }
  }

  /** The side not read, whose IDs new candidates avoid. */
  get #other(): BackendSession {
    return this.#readSide === "kvstore" ? this.#crd : this.#kv;
  }

  async #watchOther(): Promise<void> {
    const signal = this.#group.signal;
    while (!signal.aborted) {
      try {
        const events = this.#tracked(this.#other.watch(signal), () => this.#otherKeys, (map) => {
          this.#otherKeys = map;
          this.#otherSynced = true;
        });
        for await (const ev of events) {
          if (ev.type === "upsert") this.#refused.delete(ev.id);
        }
      } catch (err) {
        if (signal.aborted) return;
        log.warning("watch of the {side} side failed, starting again: {err}", {
          side: this.#readSide === "kvstore" ? "crd" : "kvstore",
          err,
        });
      }
      await sleep(REWATCH_MS, signal).catch(() => {});
    }
  }

  /** The allocator's `exclude` plus every ID the other side is known to hold. */
  #excluding(exclude: ReadonlySet<number>): ReadonlySet<number> {
    if (this.#otherKeys.size === 0 && this.#refused.size === 0) return exclude;
    return new Set([...exclude, ...this.#otherKeys.keys(), ...this.#refused]);
  }

  #kvstoreTrail(trail: AttemptTrail | undefined): AttemptTrail | undefined {
    if (trail === undefined) return undefined;
    let other = this.#kvstoreTrails.get(trail);
    if (other === undefined) this.#kvstoreTrails.set(trail, other = {});
    return other;
  }

  /**
   * Cilium's `AllocateID` and `AcquireReference`, in its order: the CRD first, then the kvstore
   * under the same ID; the CRD identity this attempt created is removed again when the kvstore
   * refuses the ID. `doublewrite-readkvstore` first asks the kvstore whether the key has an ID,
   * which then is the key's ID (its CRD twin is created when missing).
   */
  async acquire(request: AcquireRequest): Promise<AcquireResult> {
    const { key, signal } = request;
    const readKv = this.#readSide === "kvstore";
    const kvTrail = this.#kvstoreTrail(request.trail);
    const common = {
      key,
      signal,
      ...(request.range === undefined ? {} : { range: request.range }),
      ...(request.roundTrips === undefined ? {} : { roundTrips: request.roundTrips }),
    };
    if (readKv) {
      const kvId = await this.#kvstoreId(request);
      if (kvId !== undefined) return await this.#joinKvstore(request, kvId, kvTrail);
    }
    const crd = await this.#crd.acquire({
      ...common,
      pickCandidate: (exclude) => request.pickCandidate(this.#excluding(exclude)),
      ...(readKv || request.hint === undefined ? {} : { hint: request.hint }),
      ...trailOf(request.trail),
    });
    let kv: AcquireResult;
    try {
      kv = await this.#kv.acquire({
        ...common,
        pickCandidate: only(crd.id),
        ...trailOf(kvTrail),
      });
    } catch (err) {
      if (!readKv && !crd.created && !signal.aborted) {
        // An identity the CRD already had: its ID stands in readcrd (Cilium's AcquireReference
        // answers the CRD side's error only); the kvstore is repaired by the sync, or is drift.
        if (err instanceof PoolExhaustedError) this.#drift(key, crd.id, undefined);
        else {log.warning("kvstore side of {key} not written ({err}); the sync retries", {
            key,
            err,
          });}
        return crd;
      }
      if (!(err instanceof PoolExhaustedError)) {
        // The kvstore write failed (unavailable, Cilium's mutex held): Cilium deletes the CRD.
        await this.#retract(key, crd, request.trail, signal);
        throw err;
      }
      // The ID is taken by another key on the kvstore.
      await this.#retract(key, crd, request.trail, signal);
      this.#refused.add(crd.id);
      throw new DoubleWriteConflictError(key, crd.id, undefined, { cause: err });
    }
    if (kv.id !== crd.id) {
      // The kvstore gave the key another ID (a kvstore-only writer got there first).
      await this.#kv.release(key, kv.id, signal);
      if (!readKv && !crd.created) {
        this.#drift(key, crd.id, kv.id);
        return crd;
      }
      await this.#retract(key, crd, request.trail, signal);
      throw new DoubleWriteConflictError(key, crd.id, kv.id);
    }
    const read = readKv ? kv : crd;
    return {
      id: crd.id,
      // The key is new to whoever created its CRD identity: the CRD is written first and once per
      // key among idalloc nodes, so exactly one racer reports it, in either read mode (a kvstore
      // master made by a racer that joined that CRD identity is its copy, not a second birth). A
      // key the kvstore already had never gets here (`#joinKvstore`); nor is it new.
      created: crd.created,
      ...(read.version === undefined ? {} : { version: read.version }),
    };
  }

  /**
   * The key's ID on the kvstore, for `doublewrite-readkvstore`: the one its live references agree
   * on (Cilium's `Get`), else the master the allocator's cache names for it. A node stopped for a
   * restart into this mode leaves its references to lapse with its lease while the master stays
   * until GC; without the second read the key would get a second identity at a new ID (as the
   * kvstore mode would not: the etcd side joins a hinted master too). The master is read, not
   * trusted from the cache, so that a master GC deleted is not copied to the CRD side.
   */
  async #kvstoreId(request: AcquireRequest): Promise<number | undefined> {
    const { key, signal, hint, roundTrips } = request;
    if (roundTrips !== undefined) roundTrips.count++;
    const referenced = await this.#kv.get(key, signal);
    if (referenced !== undefined || hint === undefined) return referenced;
    if (roundTrips !== undefined) roundTrips.count++;
    return (await this.#kv.getById(hint.id, signal)) === key ? hint.id : undefined;
  }

  /**
   * `doublewrite-readkvstore` with the kvstore's ID known: the CRD twin first (created if
   * missing; a CRD that cannot take the ID is drift and does not fail the allocation, as in
   * Cilium), then the kvstore reference.
   */
  async #joinKvstore(
    request: AcquireRequest,
    id: number,
    kvTrail: AttemptTrail | undefined,
  ): Promise<AcquireResult> {
    const { key, signal } = request;
    const common = {
      key,
      signal,
      pickCandidate: only(id),
      ...(request.range === undefined ? {} : { range: request.range }),
      ...(request.roundTrips === undefined ? {} : { roundTrips: request.roundTrips }),
    };
    // An earlier attempt of this allocation that wrote (or sent) the CRD identity before the
    // kvstore had the key made the key: it stays new to this allocation when a retry lands here.
    const trail = request.trail;
    const earlier = trail?.created ?? trail?.unconfirmed?.id;
    try {
      const crd = await this.#crd.acquire({ ...common, ...trailOf(trail) });
      if (crd.id !== id) {
        await this.#crd.release(key, crd.id, signal);
        this.#drift(key, crd.id, id);
      }
    } catch (err) {
      if (signal.aborted) throw err;
      if (err instanceof PoolExhaustedError) this.#drift(key, undefined, id);
      else log.warning("CRD side of {key} not written ({err}); the sync retries", { key, err });
    }
    let kv: AcquireResult;
    try {
      kv = await this.#kv.acquire({
        ...common,
        ...(request.hint === undefined ? {} : { hint: request.hint }),
        ...trailOf(kvTrail),
      });
    } catch (err) {
      if (!(err instanceof PoolExhaustedError)) throw err;
      // The master read a moment ago is gone (GC) or names another key now: read again.
      await this.#crd.release(key, id, signal).catch(() => {});
      throw new ConflictError(`key '${key}' lost its kvstore ID ${id} while joining it`, {
        cause: err,
      });
    }
    if (kv.id !== id) {
      // The kvstore's answer changed since it was read (GC, another writer): read again.
      await this.#crd.release(key, id, signal).catch(() => {});
      throw new ConflictError(`key '${key}' moved from ID ${id} to ${kv.id} on the kvstore`);
    }
    // A CRD twin (or a kvstore master) written here copies a key that existed: not a new one.
    if (trail !== undefined && earlier !== id && trail.created === id) delete trail.created;
    return { ...kv, created: earlier === id && trail?.created === id };
  }

  /**
   * Undoes the CRD side of a failed attempt: this node's reference, and the identity itself when
   * this attempt created it and nobody uses it (Cilium's `DeleteID` after a failed kvstore write,
   * here guarded by the CRD side's own GC rule: no live reference, no endpoint naming it).
   */
  async #retract(
    key: string,
    crd: AcquireResult,
    crdTrail: AttemptTrail | undefined,
    signal: AbortSignal,
  ): Promise<void> {
    try {
      await this.#crd.release(key, crd.id, signal);
      if (!crd.created) return;
      const range = { min: crd.id, max: crd.id };
      for await (const candidate of this.#crd.gcList(range, signal)) {
        if (candidate.id !== crd.id || candidate.key !== key || candidate.inUse) continue;
        if (!await this.#crd.gcDelete(candidate, signal)) continue;
        // The identity this allocation made is gone: whoever creates the key's CRD identity next
        // made the key, not this allocation (else a retry that joins it would report it too).
        if (crdTrail?.created === crd.id) delete crdTrail.created;
      }
    } catch (err) {
      if (signal.aborted) throw err;
      // Left for GC: unreferenced, it is collected like any unused identity.
      log.warning("could not remove CRD identity {id} of {key} again: {err}", {
        id: crd.id,
        key,
        err,
      });
    }
  }

  #drift(key: string, crdId: number | undefined, kvstoreId: number | undefined): void {
    log.warning(
      "key {key} differs between the stores (CRD: {crdId}, kvstore: {kvstoreId}); " +
        "{mode} answers the {side} side's ID (idalloc doctor lists such keys)",
      {
        key,
        crdId: crdId ?? "-",
        kvstoreId: kvstoreId ?? "-",
        mode: this.#mode,
        side: this.#readSide,
      },
    );
  }

  /** Deletes this node's references on both sides (Cilium releases on the kvstore only). */
  async release(key: string, id: number, signal: AbortSignal): Promise<void> {
    const results = await Promise.allSettled([
      this.#kv.release(key, id, signal),
      this.#crd.release(key, id, signal),
    ]);
    const failed = results.find((r) => r.status === "rejected");
    if (failed) throw failed.reason;
  }

  /**
   * Cilium's `UpdateKey`: the CRD side first, then the kvstore, each re-creating what is missing.
   * The read side's report decides; a conflict on the other side is drift (logged), never a
   * reason to move a held key to another ID.
   */
  async ensure(held: readonly HeldKey[], signal: AbortSignal): Promise<EnsureReport[]> {
    const crd = await this.#sideEnsure("crd", held, signal);
    const kv = await this.#sideEnsure("kvstore", held, signal);
    const [read, other] = this.#readSide === "kvstore" ? [kv!, crd] : [crd!, kv];
    return read.map((report, i) => {
      const theirs = other?.[i];
      if (theirs?.master === "conflict") {
        this.#drift(report.key, undefined, undefined);
      }
      if (report.master === "ok" && theirs?.master === "busy") return { ...report, master: "busy" };
      return report;
    });
  }

  async #sideEnsure(
    side: Side,
    held: readonly HeldKey[],
    signal: AbortSignal,
  ): Promise<EnsureReport[] | undefined> {
    const session = side === "kvstore" ? this.#kv : this.#crd;
    try {
      return await session.ensure(held, signal);
    } catch (err) {
      if (side === this.#readSide || signal.aborted) throw err;
      log.warning("ensure on the {side} side failed; the next sync retries: {err}", { side, err });
      return undefined;
    }
  }

  /** The read side's answer (Cilium's `Get`). */
  get(key: string, signal: AbortSignal): Promise<number | undefined> {
    return this.#read.get(key, signal);
  }

  /** The read side's answer (Cilium's `GetByID`). */
  getById(id: number, signal: AbortSignal): Promise<string | undefined> {
    return this.#read.getById(id, signal);
  }

  /** The read side's masters (Cilium's `ListAndWatch`), noted for the per-side counts. */
  watch(signal: AbortSignal): AsyncIterable<BackendEvent> {
    return this.#tracked(this.#read.watch(signal), () => this.#readKeys, (map) => {
      this.#readKeys = map;
      this.#readSynced = true;
    });
  }

  /** The kvstore's masters, each in use when either side uses it (see `./gc.ts`). */
  gcList(
    range: { min: number; max: number },
    signal: AbortSignal,
    options?: GcListOptions,
  ): AsyncIterable<GcCandidate> {
    return listBoth(this.#kv, this.#crd, range, signal, options);
  }

  /** The kvstore master, then its CRD twin, each under its own guard (see `./gc.ts`). */
  gcDelete(candidate: GcCandidate, signal: AbortSignal): Promise<boolean> {
    return deleteBoth(this.#kv, this.#crd, candidate, signal);
  }

  /** Until when both sides' references are certainly alive: the earlier of the two. */
  claimValidUntil(): number {
    return Math.min(this.#kv.claimValidUntil(), this.#crd.claimValidUntil());
  }

  /** Renews both sides' leases. */
  async renew(signal: AbortSignal): Promise<void> {
    await Promise.all([this.#kv.renew(signal), this.#crd.renew(signal)]);
  }

  /** Both sides' health: healthy when both are. */
  status(): SessionStatus {
    const kv = this.#kv.status();
    const crd = this.#crd.status();
    const ends = [kv.leaseExpiresAt, crd.leaseExpiresAt].filter((t) => t !== undefined);
    const lastError = kv.lastError ?? crd.lastError;
    return {
      backend: this.#mode,
      node: kv.node,
      endpoints: [...kv.endpoints, ...crd.endpoints],
      ...(kv.leader === undefined ? {} : { leader: kv.leader }),
      leases: kv.leases + crd.leases,
      ...(ends.length === 0 ? {} : { leaseExpiresAt: Math.min(...ends) }),
      ...(lastError === undefined ? {} : { lastError }),
      healthy: kv.healthy && crd.healthy,
    };
  }

  /** Stops the other side's watch and closes both sessions. */
  async close(): Promise<void> {
    this.#metrics?.[Symbol.dispose]();
    this.#metrics = undefined;
    await this.#group.close();
    await Promise.allSettled([this.#kv.close(), this.#crd.close()]);
  }

  /** Same as {@linkcode DoubleWriteSession.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function trailOf(trail: AttemptTrail | undefined): { trail?: AttemptTrail } {
  return trail === undefined ? {} : { trail };
}
