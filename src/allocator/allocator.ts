/**
 * The backend-agnostic allocator: local reference counts, the watch-fed cache, ID selection,
 * retries, the periodic re-creation of vanished references, master-key protection and GC.
 *
 * @example Allocate, look up and release on an embedded Deno KV store
 * ```ts
 * import { Allocator, DenoKvBackend } from "@idalloc/idalloc";
 *
 * using kv = await Deno.openKv(":memory:");
 * const backend = new DenoKvBackend(kv, { prefix: ["idalloc", "demo"], node: "node-a" });
 * await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *
 * const { id, isNew } = await alloc.allocate("app=web;");
 * console.log(id, isNew, await alloc.getById(id)); // 16352 true app=web;
 * await alloc.release("app=web;");
 * ```
 *
 * @module
 */
import type { Backend, BackendEvent, BackendSession, HeldKey, IdRange } from "./backend.ts";
import { backoffDelay } from "./backoff.ts";
import { abortable, sleep } from "../abort.ts";
import { type CacheChange, IdCache } from "./cache.ts";
import { EventQueue } from "./event_queue.ts";
import { Fence, type FenceStatus } from "./fence.ts";
import { GarbageCollector, RateLimiter } from "./gc.ts";
import { IdPool } from "./id_pool.ts";
import { KeyedMutex } from "./keyed_mutex.ts";
import { LocalKeys } from "./local_keys.ts";
import { type AllocatorSettings, applyMask, resolveOptions } from "./options.ts";
import type { AcquireResult } from "./backend.ts";
import type {
  AllocateResult,
  AllocatorEvent,
  AllocatorOptions,
  CallOptions,
  GcStats,
  ReleaseResult,
} from "./types.ts";
import {
  AllocationFailedError,
  ClosedError,
  IdallocError,
  InvalidIdError,
  InvalidKeyError,
  KeyLockedError,
  KeyNotHeldError,
  PoolExhaustedError,
  ReadOnlyError,
} from "../errors.ts";
import { idallocLogger } from "../log.ts";
import {
  type AllocationCounts,
  type AllocatorGauges,
  AllocatorTelemetry,
  identityOf,
  type ReleaseNote,
} from "../telemetry/allocator.ts";

const log = idallocLogger("allocator");

/** Held keys re-checked per `ensure` call of the periodic sync. */
const SYNC_BATCH = 32;
/** Cap of the linear retry delay when re-creating a protected master key. */
const PROTECT_MAX_DELAY_MS = 10_000;

/** Counters of an allocator, for status pages and tests. */
export interface AllocatorStatus {
  /** Keys this node holds. */
  readonly heldKeys: number;
  /** IDs in the watch-fed cache. */
  readonly cachedIds: number;
  /** Whether the initial list has been received. */
  readonly synced: boolean;
  /** Free IDs in the range, as far as the cache knows. */
  readonly availableIds: number;
  /** Events waiting in subscribers' queues (a slow consumer shows here). */
  readonly queuedEvents: number;
  /**
   * Whether the node reaches the store and can prove its claims: the session is healthy, its
   * lease is confirmed (see {@linkcode BackendSession.claimValidUntil}) and no held key is fenced.
   */
  readonly healthy: boolean;
  /** The fence: held keys under re-check after a lease lapse, replacement or conflict. */
  readonly fence: FenceStatus;
  /** `allocate` calls since open by outcome (what the metric `idalloc.allocations` counts). */
  readonly allocations: AllocationCounts;
  /** The backend session's status. */
  readonly session: ReturnType<BackendSession["status"]>;
}

/**
 * Gives every node the same small integer ID for the same key. Open one per node and store
 * namespace with {@linkcode Allocator.open}; close it with `close()` or `await using`.
 *
 * @typeParam K the key type; strings by default, anything else through a {@linkcode KeyCodec}.
 */
export class Allocator<K = string> implements AsyncDisposable {
  readonly #backend: Backend;
  readonly #session: BackendSession;
  readonly #settings: AllocatorSettings<K>;
  // Own allocations enter the cache decoded (see `IdCache.insertLocal`); settings are set by then.
  readonly #cache = new IdCache<K>((k) => this.#settings.codec.decode(k));
  readonly #pool: IdPool;
  readonly #local = new LocalKeys();
  readonly #mutex = new KeyedMutex();
  readonly #subscribers = new Set<EventQueue<AllocatorEvent<K>>>();
  readonly #gc: GarbageCollector;
  /** The stored IDs (mask applied) of this allocator's range. */
  readonly #gcRange: IdRange;
  readonly #closing = new AbortController();
  readonly #tasks = new Set<Promise<unknown>>();
  /** Keys whose last release could not delete the reference; the sync retries them. */
  readonly #pendingReleases = new Map<string, number>();
  /** IDs whose master is being re-created by master-key protection. */
  readonly #protecting = new Set<number>();
  /** Held keys this node may not answer from memory until the store is re-checked. */
  readonly #fence = new Fence();
  /** Metrics and spans (see `src/telemetry/`). */
  readonly #telemetry: AllocatorTelemetry;
  /** Fires when the session's claim runs out, unless a renewal pushed it further. */
  #claimTimer: ReturnType<typeof setTimeout> | undefined;
  /** A loop re-checking held keys until the fence is down is running. */
  #resolving = false;
  #synced = false;
  #syncedSignal = Promise.withResolvers<void>();
  #syncRunning: Promise<void> | undefined;
  #syncAgain = false;
  #closed: Promise<void> | undefined;

  private constructor(backend: Backend, session: BackendSession, settings: AllocatorSettings<K>) {
    this.#backend = backend;
    this.#session = session;
    this.#settings = settings;
    this.#pool = new IdPool(settings.min, settings.max);
    this.#gcRange = {
      min: applyMask(settings.min, settings.prefixMask),
      max: applyMask(settings.max, settings.prefixMask),
    };
    this.#gc = new GarbageCollector(
      session,
      this.#gcRange,
      new RateLimiter(settings.gcRateLimit.intervalMs, settings.gcRateLimit.burst),
      settings.gcGraceMs,
    );
    // Nobody may be left waiting on a sync that will never come.
    this.#syncedSignal.promise.catch(() => {});
    this.#telemetry = new AllocatorTelemetry(identityOf(backend));
  }

  /**
   * Opens an allocator on `backend`: validates `options` (throws {@linkcode InvalidOptionsError}),
   * opens the backend session (the node's lease) and starts the watch that fills the cache.
   * Allocation waits for the initial list; `open` does not.
   */
  static async open<K = string>(
    backend: Backend,
    options: AllocatorOptions<K>,
    callOptions?: CallOptions,
  ): Promise<Allocator<K>> {
    const settings = resolveOptions(options);
    // The session may report a lost lease before the allocator exists; nothing is held then.
    const opened: { allocator?: Allocator<K> } = {};
    const session = await backend.openSession({
      leaseTtlMs: settings.leaseTtlMs,
      readOnly: settings.readOnly,
      onLeaseReplaced: () => {
        if (opened.allocator) opened.allocator.#onLeaseReplaced();
      },
      signal: callOptions?.signal,
    });
    const allocator = new Allocator(backend, session, settings);
    opened.allocator = allocator;
    allocator.#start();
    return allocator;
  }

  /** The backend this allocator runs on. */
  get backend(): Backend {
    return this.#backend;
  }

  /** The ID range `[min, max]` (before the prefix mask). */
  get range(): { readonly min: number; readonly max: number } {
    return { min: this.#settings.min, max: this.#settings.max };
  }

  #start(): void {
    const signal = this.#closing.signal;
    this.#telemetry.open(() => this.#gauges());
    this.#spawn(this.#watchLoop(signal));
    if (!this.#settings.readOnly) {
      this.#armClaimTimer();
      this.#spawn(this.#every(this.#settings.syncIntervalMs, signal, () => this.#requestSync()));
      if (this.#settings.gcIntervalMs !== undefined) {
        this.#spawn(this.#every(this.#settings.gcIntervalMs, signal, async () => {
          const stats = await this.runGc({ signal });
          log.debug("GC pass: {deleted} deleted, {marked} marked", { ...stats });
        }));
      }
    }
  }

  #spawn(task: Promise<unknown>): void {
    const tracked = task.catch((err) => {
      if (!this.#closing.signal.aborted) log.error("background task failed: {err}", { err });
    }).finally(() => this.#tasks.delete(tracked));
    this.#tasks.add(tracked);
  }

  async #every(ms: number, signal: AbortSignal, fn: () => unknown): Promise<void> {
    await this.#syncedSignal.promise;
    while (!signal.aborted) {
      await sleep(ms, signal);
      try {
        await fn();
      } catch (err) {
        if (!signal.aborted) log.warning("periodic task failed: {err}", { err });
      }
    }
  }

  // ---------------------------------------------------------------- watch → cache

  async #watchLoop(signal: AbortSignal): Promise<void> {
    for (let attempt = 0; !signal.aborted; attempt++) {
      // A (re)started watch re-lists: IDs not seen again before `synced` have vanished.
      const seen = new Set<number>();
      const listedFrom = this.#cache.mark();
      let listing = true;
      try {
        for await (const event of this.#telemetry.watched(this.#session.watch(signal))) {
          if (event.type === "synced") {
            if (listing) {
              listing = false;
              for (const [id] of [...this.#cache.entries()]) {
                if (!seen.has(id) && this.#cache.unlisted(id, listedFrom)) this.#onDelete(id);
              }
            }
            attempt = 0;
            this.#markSynced();
            continue;
          }
          if (listing) seen.add(event.id);
          this.#onEvent(event);
        }
        if (signal.aborted) return;
        log.warning("store watch ended; restarting it");
      } catch (err) {
        if (signal.aborted) return;
        this.#telemetry.reconnect(err);
        log.warning("store watch failed, restarting: {err}", { err });
      }
      await sleep(backoffDelay(this.#settings.backoff, attempt) + 50, signal).catch(() => {});
    }
  }

  #markSynced(): void {
    if (this.#synced) return;
    this.#synced = true;
    this.#syncedSignal.resolve();
    this.#telemetry.synced();
  }

  #onEvent(event: Exclude<BackendEvent, { type: "synced" }>): void {
    if (event.type === "delete") return this.#onDelete(event.id);
    const reason = this.#settings.validator?.({ type: "upsert", id: event.id, key: event.key });
    if (reason !== undefined) {
      log.warning("skipping event for invalid ID {id}: {reason}", { id: event.id, reason });
      return;
    }
    let value: K;
    try {
      value = this.#settings.codec.decode(event.key);
    } catch (err) {
      log.warning("skipping ID {id}: its key cannot be decoded: {err}", { id: event.id, err });
      return;
    }
    this.#pool.remove(this.#unmask(event.id));
    this.#publish(this.#cache.upsert(event.id, event.key, value, event.version));
    const holder = this.#local.keyOf(event.id);
    if (holder !== undefined && holder !== event.key) {
      this.#conflict(holder, `ID ${event.id} now belongs to '${event.key}'`);
    }
    // A second master of a held key: on etcd possibly a leftover, but worth one re-check.
    const held = this.#local.get(event.key);
    if (held !== undefined && held.id !== event.id) {
      this.#conflict(event.key, `the store also maps it to ID ${event.id}`);
    }
  }

  #onDelete(id: number): void {
    const cached = this.#cache.entry(id);
    const reason = this.#settings.validator?.({ type: "delete", id, key: cached?.key });
    if (reason !== undefined) {
      log.warning("skipping delete of invalid ID {id}: {reason}", { id, reason });
      return;
    }
    const heldKey = this.#local.keyOf(id);
    if (this.#settings.masterKeyProtection && heldKey !== undefined && !this.#settings.readOnly) {
      // The ID is still in use here: re-create its master and show consumers no delete.
      this.#protect(heldKey, id);
      return;
    }
    this.#pool.insert(this.#unmask(id));
    this.#publish(this.#cache.delete(id));
  }

  #publish(change: CacheChange<K> | undefined): void {
    if (!change) return;
    for (const queue of this.#subscribers) queue.push(change);
  }

  #unmask(id: number): number {
    if (this.#pool.contains(id) || this.#settings.prefixMask === 0) return id;
    return Number(BigInt(id) & ~BigInt(this.#settings.prefixMask));
  }

  #protect(key: string, id: number): void {
    if (this.#protecting.has(id)) return;
    this.#protecting.add(id);
    const signal = this.#closing.signal;
    this.#spawn((async () => {
      try {
        for (let attempt = 1; !signal.aborted; attempt++) {
          try {
            using _lock = await this.#mutex.lock(key, signal);
            if (this.#local.get(key)?.id !== id) return; // released meanwhile: nothing to protect
            // Protection re-creates a master only for a key with no other ID: one that meanwhile
            // got another master moves to the ID the store gives it.
            if (this.#secondMaster({ key, id })) {
              this.#conflict(key, `it has another master; ID ${id} is not re-created`);
              return;
            }
            const [report] = await this.#session.ensure([{ key, id }], signal);
            if (report.master === "conflict") {
              // Someone else has the ID or the key now: the key moves to a new ID.
              this.#conflict(key, `master of ID ${id} cannot be re-created`);
              return;
            }
            if (report.master !== "busy") {
              log.warning("re-created deleted master key of ID {id} ({key}), still in use here", {
                id,
                key,
              });
              return;
            }
          } catch (err) {
            if (signal.aborted) return;
            log.warning("re-creating master of ID {id} failed: {err}", { id, err });
          }
          await sleep(Math.min(attempt * 1_000, PROTECT_MAX_DELAY_MS), signal);
        }
      } finally {
        this.#protecting.delete(id);
      }
    })());
  }

  // ---------------------------------------------------------------- fencing

  #onLeaseReplaced(): void {
    if (this.#closing.signal.aborted) return;
    // Every reference of the old lease is gone: nothing held may be answered until re-checked.
    this.#fence.raiseAll("lease replaced");
    log.warning("lease replaced: re-checking {n} held keys before answering them", {
      n: this.#local.size,
    });
    this.#resolveFence();
  }

  /**
   * Arms a timer for the moment the session's claim runs out, so that a node whose lease could
   * not be renewed starts re-checking its keys at once, even when nobody asks it anything.
   */
  #armClaimTimer(): void {
    clearTimeout(this.#claimTimer);
    this.#claimTimer = undefined;
    const until = this.#session.claimValidUntil();
    if (this.#closing.signal.aborted || this.#resolving || !Number.isFinite(until)) return;
    const delay = Math.min(Math.max(0, until - Date.now()), 2 ** 31 - 1);
    this.#claimTimer = setTimeout(() => {
      this.#claimTimer = undefined;
      if (Date.now() >= this.#session.claimValidUntil()) this.#lapsed();
      else this.#armClaimTimer();
    }, delay);
  }

  /**
   * Whether held keys may be answered from memory: the fence is down and the claim has not run
   * out. The clock is read on every answer, not left to the claim timer alone: when a stopped
   * process resumes, a caller's timer that was due earlier runs before ours. A lapse found here
   * raises the fence at once.
   */
  #answersFromMemory(): boolean {
    if (Date.now() >= this.#session.claimValidUntil()) {
      this.#lapsed();
      return false;
    }
    return !this.#fence.active;
  }

  /**
   * The claim ran out before the lease could be renewed (a stall, an unreachable store). Raised
   * again each time it is seen while it lasts, so that keys a running re-check verified before the
   * lapse are not answered: only a re-check that starts after the claim is valid again clears it.
   */
  #lapsed(): void {
    if (this.#closing.signal.aborted) return;
    if (this.#fence.raiseAll("lease lapsed")) {
      log.warning("lease of {node} lapsed before renewal: fencing {n} held keys until re-checked", {
        node: this.#backend.node,
        n: this.#local.size,
      });
    }
    this.#resolveFence();
  }

  /** The store shows held `key`'s ID under another key, or the key under another ID. */
  #conflict(key: string, why: string): void {
    if (this.#closing.signal.aborted || this.#fence.isSuspect(key)) return;
    this.#fence.raise(key);
    log.warning("held key {key} conflicts with the store ({why}): re-checking it", { key, why });
    this.#resolveFence();
  }

  /** Re-checks held keys (re-acquiring those whose ID was taken) until the fence is down. */
  #resolveFence(): void {
    if (this.#resolving || this.#settings.readOnly || this.#closing.signal.aborted) return;
    this.#resolving = true;
    clearTimeout(this.#claimTimer);
    this.#claimTimer = undefined;
    const signal = this.#closing.signal;
    this.#spawn((async () => {
      try {
        for (let attempt = 0; this.#fence.active && !signal.aborted; attempt++) {
          if (attempt > 0) await sleep(backoffDelay(this.#settings.backoff, attempt - 1), signal);
          await this.#requestSync("fence");
        }
      } finally {
        this.#resolving = false;
        this.#armClaimTimer();
      }
    })());
  }

  // ---------------------------------------------------------------- public API

  #checkOpen(): void {
    if (this.#closed) throw new ClosedError("allocator");
  }

  #checkWritable(operation: string): void {
    this.#checkOpen();
    if (this.#settings.readOnly) throw new ReadOnlyError(operation);
  }

  #encode(key: K): string {
    let encoded: unknown;
    try {
      encoded = this.#settings.codec.encode(key);
    } catch (err) {
      throw new InvalidKeyError("key cannot be encoded", { cause: err });
    }
    if (typeof encoded !== "string") {
      throw new InvalidKeyError(`encoded key must be a string, got ${typeof encoded}`);
    }
    if (encoded.length === 0) throw new InvalidKeyError("key must not be empty");
    return encoded;
  }

  #signal(options?: CallOptions): AbortSignal {
    return options?.signal
      ? AbortSignal.any([options.signal, this.#closing.signal])
      : this.#closing.signal;
  }

  /**
   * Returns the cluster-wide ID of `key`, creating it if no node has one, and takes one local
   * reference. A key this node already holds costs no store operation. Retries conflicts and store
   * errors with capped, jittered backoff; throws {@linkcode AllocationFailedError} after
   * `maxAttempts`, {@linkcode InvalidKeyError} for a key the store cannot hold (before anything is
   * written), and rejects with `signal.reason` when aborted.
   */
  async allocate(key: K, options?: CallOptions): Promise<AllocateResult> {
    let k: string;
    try {
      this.#checkWritable("allocate");
      k = this.#encode(key);
    } catch (err) {
      this.#telemetry.failed(err);
      throw err;
    }
    const held = this.#local.get(k);
    if (held && this.#answersFromMemory()) {
      held.refcnt++;
      // The hot path's whole telemetry: a plain increment that an observable counter reports.
      this.#telemetry.cached++;
      return { id: held.id, isNew: false, firstUse: false };
    }
    return await this.#telemetry.allocation((trips) => this.#allocateStored(k, options, trips));
  }

  /** `allocate` past the cached answer: the key's lock, then the store. */
  async #allocateStored(
    k: string,
    options: CallOptions | undefined,
    trips: { count: number },
  ): Promise<AllocateResult> {
    this.#backend.checkKey(k);
    const signal = this.#signal(options);
    await this.waitForInitialSync({ signal });
    for (;;) {
      // Never wait on the fence while holding the key's lock: the re-check needs that lock.
      if (this.#local.get(k) && this.#fence.isSuspect(k)) await this.#fence.until(k, signal);
      using _lock = await this.#mutex.lock(k, signal);
      const again = this.#local.get(k);
      if (again) {
        if (this.#fence.isSuspect(k)) continue;
        again.refcnt++;
        return { id: again.id, isNew: false, firstUse: false };
      }
      const result = await this.#acquire(k, signal, undefined, trips);
      this.#local.add(k, result.id);
      this.#pendingReleases.delete(k);
      return { id: result.id, isNew: result.created, firstUse: true };
    }
  }

  /**
   * Acquires `k` in the store (the caller holds its lock), retrying retryable failures with
   * backoff: at most `maxAttempts` attempts, plus waits for other writers' locks (a Cilium mutex)
   * of up to `lockWaitMs` in all, which do not count as attempts (`lockWaitMs` 0: a held lock
   * fails the call at once). Records the ID in the pool and the cache; the caller records the local
   * hold.
   */
  async #acquire(
    k: string,
    signal: AbortSignal,
    lockWaitMs = this.#settings.lockWaitMs,
    roundTrips?: { count: number },
  ): Promise<AcquireResult> {
    let lastError: unknown;
    let lockWaitUntil: number | undefined;
    let waits = 0;
    for (let attempt = 0; attempt < this.#settings.maxAttempts;) {
      if (attempt + waits > 0) {
        await sleep(backoffDelay(this.#settings.backoff, attempt + waits - 1), signal);
      }
      signal.throwIfAborted();
      const leased: number[] = [];
      try {
        const hint = this.#cache.lookup(k);
        // A master outside this allocator's range (another cluster's identity under the same
        // prefix) is never a hint: joining it would write a reference to an ID this node refuses.
        const inRange = hint !== undefined && hint.id >= this.#gcRange.min &&
          hint.id <= this.#gcRange.max;
        const result = await this.#session.acquire({
          key: k,
          hint: inRange && hint.version !== undefined
            ? { id: hint.id, version: hint.version }
            : undefined,
          pickCandidate: (exclude) => {
            const unmasked = this.#pool.lease(k, this.#unmaskSet(exclude));
            if (unmasked === undefined) return undefined;
            leased.push(unmasked);
            return applyMask(unmasked, this.#settings.prefixMask);
          },
          range: this.#gcRange,
          signal,
          roundTrips,
        });
        const id = this.#validId(result.id, k);
        this.#pool.remove(this.#unmask(id));
        this.#publish(this.#cache.insertLocal(k, id, result.version));
        return { ...result, id };
      } catch (err) {
        if (signal.aborted) {
          // The write may have landed before the abort: make sure no reference outlives the call.
          this.#dropAbandonedReference(k);
          throw signal.reason;
        }
        if (!(err instanceof IdallocError && err.retryable)) throw err;
        // The session does not know the range; say it here.
        lastError = err instanceof PoolExhaustedError
          ? new PoolExhaustedError(this.#settings.min, this.#settings.max, { cause: err })
          : err;
        if (err instanceof KeyLockedError) {
          // Another writer is between the steps of its own allocation: wait for it to finish (or
          // for its lease to lapse if it died), as a Cilium node would wait for the mutex.
          if (lockWaitMs === 0) throw err;
          lockWaitUntil ??= Date.now() + lockWaitMs;
          if (Date.now() < lockWaitUntil) {
            waits = Math.min(waits + 1, 8);
            log.debug("key {key} is locked by another writer; waiting: {err}", { key: k, err });
            this.#telemetry.retry(err);
            continue;
          }
        }
        attempt++;
        log.debug("allocation attempt {attempt} for {key} failed: {err}", { attempt, key: k, err });
        if (attempt < this.#settings.maxAttempts) this.#telemetry.retry(err);
      } finally {
        for (const id of leased) this.#pool.release(id);
      }
    }
    throw new AllocationFailedError(k, this.#settings.maxAttempts, { cause: lastError });
  }

  #dropAbandonedReference(key: string): void {
    this.#pendingReleases.set(key, 0);
    const signal = this.#closing.signal;
    this.#spawn((async () => {
      using _lock = await this.#mutex.lock(key, signal);
      if (this.#local.get(key) || !this.#pendingReleases.has(key)) return;
      await this.#session.release(key, 0, signal);
      this.#pendingReleases.delete(key);
    })());
  }

  #unmaskSet(ids: ReadonlySet<number>): ReadonlySet<number> {
    if (this.#settings.prefixMask === 0 || ids.size === 0) return ids;
    return new Set([...ids].map((id) => this.#unmask(id)));
  }

  #validId(id: number, key: string): number {
    const { min, max } = this.#gcRange;
    if (!Number.isSafeInteger(id) || id < min || id > max) {
      throw new InvalidIdError(
        `store returned ID ${id} for key '${key}', outside this allocator's range [${min}, ${max}]`,
      );
    }
    return id;
  }

  /**
   * Drops one local reference to `key`. On the last local use the node's reference is removed from
   * the store (`lastUse: true`); the ID's master stays until GC. Throws {@linkcode KeyNotHeldError}
   * for a key this allocator does not hold.
   */
  release(key: K, options?: CallOptions): Promise<ReleaseResult> {
    return this.#telemetry.release((note) => this.#release(key, options, note));
  }

  async #release(
    key: K,
    options: CallOptions | undefined,
    note: ReleaseNote,
  ): Promise<ReleaseResult> {
    this.#checkWritable("release");
    const k = this.#encode(key);
    const signal = this.#signal(options);
    await this.waitForInitialSync({ signal });
    using _lock = await this.#mutex.lock(k, signal);
    const entry = this.#local.get(k);
    if (!entry) throw new KeyNotHeldError(k);
    if (!this.#local.release(k)) return { lastUse: false };
    this.#fence.forget(k);
    try {
      await this.#session.release(k, entry.id, signal);
    } catch (err) {
      // The local hold is gone either way; the sync keeps trying to delete the reference so it
      // cannot pin the ID forever.
      this.#pendingReleases.set(k, entry.id);
      note.deferred = true;
      log.warning("could not delete reference of {key}; will retry: {err}", { key: k, err });
    }
    return { lastUse: true };
  }

  /**
   * The ID of `key` from the cache, else from the store; `undefined` if it has none.
   *
   * While the node is fenced (its lease lapsed or was replaced, or the store contradicted a held
   * key), a held key's ID is answered only once the key has been re-checked — this waits for
   * that, bounded by `signal` — and other keys are read from the store.
   */
  async get(key: K, options?: CallOptions): Promise<number | undefined> {
    this.#checkOpen();
    const k = this.#encode(key);
    const held = this.#local.get(k);
    if (held) {
      if (this.#answersFromMemory()) return held.id;
      await this.#fence.until(k, this.#signal(options));
      const now = this.#local.get(k);
      if (now) return now.id;
    }
    if (this.#fence.active) return await this.#session.get(k, this.#signal(options));
    const cached = this.#cache.lookup(k)?.id;
    if (cached !== undefined) return cached;
    return await this.#session.get(k, this.#signal(options));
  }

  /** The ID of `key` read from the store, bypassing the cache (Cilium's `GetNoCache`). */
  async getNoCache(key: K, options?: CallOptions): Promise<number | undefined> {
    this.#checkOpen();
    return await this.#session.get(this.#encode(key), this.#signal(options));
  }

  /** The key of `id` from the cache, else from the store; `undefined` if no master exists. */
  async getById(id: number, options?: CallOptions): Promise<K | undefined> {
    this.#checkOpen();
    if (!Number.isSafeInteger(id) || id <= 0) {
      throw new InvalidIdError(`ID must be a positive safe integer, got ${id}`);
    }
    const cached = this.#cache.entry(id);
    if (cached) return cached.value;
    const stored = await this.#session.getById(id, this.#signal(options));
    if (stored === undefined) return undefined;
    try {
      return this.#settings.codec.decode(stored);
    } catch (err) {
      log.warning("master of ID {id} holds an undecodable key: {err}", { id, err });
      return undefined;
    }
  }

  /**
   * The cached ID of `key` (no store access). `undefined` for a held key that is fenced and not
   * re-checked yet (see {@linkcode Allocator.get}).
   */
  cachedId(key: K): number | undefined {
    const k = this.#encode(key);
    const held = this.#local.get(k);
    if (held) return this.#answersFromMemory() || !this.#fence.isSuspect(k) ? held.id : undefined;
    return this.#cache.lookup(k)?.id;
  }

  /** The cached key of `id` (no store access). */
  cachedKey(id: number): K | undefined {
    return this.#cache.entry(id)?.value;
  }

  /**
   * Every cached `[id, key]` mapping (Cilium's `ForeachCache`), leaving out the IDs of held keys
   * that are fenced and not re-checked yet.
   */
  *entries(): IterableIterator<[number, K]> {
    const fenced = this.#local.size > 0 && !this.#answersFromMemory();
    for (const [id, entry] of this.#cache.entries()) {
      if (fenced) {
        const holder = this.#local.keyOf(id);
        if (holder !== undefined && this.#fence.isSuspect(holder)) continue;
      }
      yield [id, entry.value];
    }
  }

  /**
   * Streams the cache: every cached mapping as an `upsert`, then one `synced`, then live
   * `upsert`/`delete` events until `signal` aborts or the allocator closes.
   *
   * Each call has its own unbounded queue: a slow consumer never blocks allocation or other
   * consumers, and loses no event; its queue (see `status().queuedEvents`) grows instead.
   *
   * A held key that lost its ID while the node could not prove its claim, and was re-acquired,
   * is reported as `reassigned`. A stream started while the node is fenced waits for the
   * re-check before its replay.
   */
  async *watch(options?: CallOptions): AsyncGenerator<AllocatorEvent<K>> {
    this.#checkOpen();
    const signal = this.#signal(options);
    await this.waitForInitialSync({ signal });
    if (this.#fence.active) await this.#fence.until(undefined, signal);
    const queue = new EventQueue<AllocatorEvent<K>>();
    // Replay and subscription happen in one synchronous step, so no change falls between them.
    for (const [id, entry] of this.#cache.entries()) {
      queue.push({ type: "upsert", id, key: entry.value });
    }
    queue.push({ type: "synced" });
    this.#subscribers.add(queue);
    const onAbort = () => queue.end();
    signal.addEventListener("abort", onAbort, { once: true });
    // An abort that came before the listener would otherwise never end the stream.
    if (signal.aborted) queue.end();
    try {
      yield* queue;
    } finally {
      signal.removeEventListener("abort", onAbort);
      this.#subscribers.delete(queue);
    }
  }

  /** Resolves once the initial list of the store has been loaded into the cache. */
  async waitForInitialSync(options?: CallOptions): Promise<void> {
    if (this.#synced) return;
    await abortable(this.#syncedSignal.promise, this.#signal(options));
  }

  /**
   * One GC pass over `[min, max]`: deletes IDs that the previous pass found unused and that are
   * still unused and unchanged, marks newly unused ones. Rate-limited by `gcRateLimit`.
   */
  async runGc(options?: CallOptions): Promise<GcStats> {
    this.#checkWritable("runGc");
    const signal = this.#signal(options);
    return await this.#telemetry.gc(() => this.#gc.run(signal));
  }

  /**
   * Re-creates, for every key held here, a vanished reference or master, and retries reference
   * deletions that failed. Runs every `syncIntervalMs` and at once when the lease was replaced;
   * call it to force one.
   */
  async sync(options?: CallOptions): Promise<void> {
    this.#checkWritable("sync");
    await this.#requestSync("requested", options?.signal);
  }

  #requestSync(reason = "periodic", signal?: AbortSignal): Promise<void> {
    if (this.#syncRunning) {
      this.#syncAgain = true;
      return abortable(this.#syncRunning, signal);
    }
    const run = (async () => {
      do {
        this.#syncAgain = false;
        try {
          await this.#telemetry.sync(reason, this.#local.size, () => this.#syncHeld(reason));
        } catch (err) {
          if (!this.#closing.signal.aborted) log.warning("key sync failed: {err}", { err });
        }
      } while (this.#syncAgain && !this.#closing.signal.aborted);
    })().finally(() => (this.#syncRunning = undefined));
    this.#syncRunning = run;
    this.#spawn(run);
    return abortable(run, signal);
  }

  async #syncHeld(reason: string): Promise<void> {
    const signal = this.#closing.signal;
    // A fenced node proves its lease first (renewing it, or replacing a lapsed one), so that what
    // this pass re-checks is held under a lease that is alive.
    if (this.#fence.active) await this.#session.renew(signal);
    const gen = this.#fence.generation;
    // Only some keys in doubt (conflicts): re-check those; the lease itself is not in question.
    const onlySuspects = reason === "fence" && this.#fence.active && !this.#fence.status().all;
    let complete = true;
    for (const [key, id] of [...this.#pendingReleases]) {
      using _lock = await this.#mutex.lock(key, signal);
      if (this.#local.get(key) || this.#pendingReleases.get(key) !== id) continue;
      await this.#session.release(key, id, signal);
      this.#pendingReleases.delete(key);
    }
    const held = this.#local.snapshot()
      .filter(({ key }) => !onlySuspects || this.#fence.isSuspect(key))
      .sort((a, b) => (a.key < b.key ? -1 : 1));
    for (let i = 0; i < held.length; i += SYNC_BATCH) {
      const batch = held.slice(i, i + SYNC_BATCH);
      // Locks in key order: one consistent order, so no deadlock with single-key holders.
      const locks: Disposable[] = [];
      try {
        for (const { key } of batch) locks.push(await this.#mutex.lock(key, signal));
        // Re-check under the locks: a key released since the snapshot must not be re-created.
        const still: HeldKey[] = [];
        for (const held of batch) {
          if (this.#local.get(held.key)?.id !== held.id) continue;
          // A suspect key is proven only if no other master names it: otherwise re-creating or
          // re-referencing this one could give the key a second ID, so it is re-acquired by the
          // store's own rule instead (and moves, announced, if that rule says so).
          if (this.#fence.isSuspect(held.key) && this.#secondMaster(held)) {
            complete = await this.#reassign(held.key, held.id, gen, signal) && complete;
          } else still.push(held);
        }
        if (still.length === 0) continue;
        for (const report of await this.#session.ensure(still, signal)) {
          // A master that appeared for the key while `ensure` ran is checked again here: the
          // key is proven only if the store holds no other ID for it when the pass answers.
          if (
            report.master === "conflict" ||
            (this.#fence.isSuspect(report.key) && this.#secondMaster(report))
          ) {
            complete = await this.#reassign(report.key, report.id, gen, signal) && complete;
            continue;
          }
          if (report.master === "busy") {
            complete = false;
            continue;
          }
          this.#fence.verified(report.key, gen);
          if (report.master === "recreated" || report.reference === "recreated") {
            log.warning("re-created missing {what} of {key} (ID {id}) [{reason}]", {
              what: report.master === "recreated" ? "master and reference" : "reference",
              key: report.key,
              id: report.id,
              reason,
            });
          }
        }
      } finally {
        for (const lock of locks) lock[Symbol.dispose]();
      }
    }
    if (complete && !onlySuspects && Date.now() < this.#session.claimValidUntil()) {
      this.#fence.passCompleted(gen);
    }
  }

  /** Whether the cache knows a master other than `held.id` that names `held.key`. */
  #secondMaster(held: HeldKey): boolean {
    const others = this.#cache.otherIds(held.key, held.id);
    if (others.length === 0) return false;
    log.warning("held key {key} (ID {id}) also has master(s) {others}: re-acquiring it", {
      ...held,
      others,
    });
    return true;
  }

  /**
   * Moves held `key` off `oldId`, which the store shows belonging to something else, to the ID
   * the store gives it now (the caller holds the key's lock). Returns whether it succeeded; on
   * failure the key stays fenced and the next pass tries again.
   */
  async #reassign(key: string, oldId: number, gen: number, signal: AbortSignal): Promise<boolean> {
    // Suspect until re-acquired: nothing may answer the old ID meanwhile.
    const raisedAt = this.#fence.raise(key);
    try {
      // Our own reference may still name the old ID; it must not hold the key there.
      await this.#session.release(key, oldId, signal);
      // No waiting for another writer's lock here: this pass holds other keys' locks too; the key
      // stays fenced and the next pass tries again.
      const { id, version } = await this.#acquire(key, signal, 0);
      this.#local.rekey(key, id);
      this.#fence.verified(key, Math.max(gen, raisedAt));
      if (id === oldId) return true;
      this.#fence.reassigned();
      this.#publish(this.#cache.insertLocal(key, id, version));
      await this.#forgetIfGone(oldId, key, signal);
      const value = this.#settings.codec.decode(key);
      log.warning("held key {key} lost ID {oldId} while fenced; re-acquired as {newId}", {
        key,
        oldId,
        newId: id,
      });
      for (const queue of this.#subscribers) {
        queue.push({ type: "reassigned", key: value, oldId, newId: id });
      }
      return true;
    } catch (err) {
      if (!signal.aborted) log.error("re-acquiring {key} failed: {err}", { key, err });
      this.#resolveFence();
      return false;
    }
  }

  /**
   * After `key` left `oldId`: a master deletion that protection kept from the cache is applied
   * now if the store has no master for `oldId` any more (when another key has it, the watch
   * reports that).
   */
  async #forgetIfGone(oldId: number, key: string, signal: AbortSignal): Promise<void> {
    if (this.#cache.entry(oldId)?.key !== key) return;
    if (await this.#session.getById(oldId, signal) !== undefined) return;
    this.#pool.insert(this.#unmask(oldId));
    this.#publish(this.#cache.delete(oldId));
  }

  /** What the observable instruments report, and most of `status()`. */
  #gauges(session = this.#session.status()): AllocatorGauges {
    let queued = 0;
    for (const queue of this.#subscribers) queued += queue.length;
    return {
      heldKeys: this.#local.size,
      cachedIds: this.#cache.size,
      availableIds: this.#pool.available,
      queuedEvents: queued,
      healthy: session.healthy && !this.#fence.active &&
        Date.now() < this.#session.claimValidUntil(),
      fence: this.#fence.status(),
    };
  }

  /** Counters and the session's health. */
  status(): AllocatorStatus {
    const session = this.#session.status();
    return {
      ...this.#gauges(session),
      synced: this.#synced,
      allocations: this.#telemetry.counts(),
      session,
    };
  }

  /**
   * Stops the watch, the sync and GC timers and the lease renewal, ends every `watch()` stream and
   * closes the backend session. Does not delete this node's references (they lapse with the lease).
   * Idempotent.
   */
  close(): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new ClosedError("allocator"));
      this.#telemetry.close();
      clearTimeout(this.#claimTimer);
      this.#claimTimer = undefined;
      this.#syncedSignal.reject(new ClosedError("allocator"));
      await Promise.allSettled([...this.#tasks]);
      await this.#session.close();
    })();
    return this.#closed;
  }

  /** Same as {@linkcode Allocator.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
