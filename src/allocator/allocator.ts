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
import { GarbageCollector, RateLimiter } from "./gc.ts";
import { IdPool } from "./id_pool.ts";
import { KeyedMutex } from "./keyed_mutex.ts";
import { LocalKeys } from "./local_keys.ts";
import { type AllocatorSettings, applyMask, resolveOptions } from "./options.ts";
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
  KeyNotHeldError,
  PoolExhaustedError,
  ReadOnlyError,
} from "../errors.ts";
import { idallocLogger } from "../log.ts";

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
  readonly #cache = new IdCache<K>();
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
    );
    // Nobody may be left waiting on a sync that will never come.
    this.#syncedSignal.promise.catch(() => {});
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
        const allocator = opened.allocator;
        if (allocator) void allocator.#requestSync("lease replaced").catch(() => {});
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
    this.#spawn(this.#watchLoop(signal));
    if (!this.#settings.readOnly) {
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
      let listing = true;
      try {
        for await (const event of this.#session.watch(signal)) {
          if (event.type === "synced") {
            if (listing) {
              listing = false;
              for (const [id] of [...this.#cache.entries()]) {
                if (!seen.has(id)) this.#onDelete(id);
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
        log.warning("store watch failed, restarting: {err}", { err });
      }
      await sleep(backoffDelay(this.#settings.backoff, attempt) + 50, signal).catch(() => {});
    }
  }

  #markSynced(): void {
    if (this.#synced) return;
    this.#synced = true;
    this.#syncedSignal.resolve();
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
            const [report] = await this.#session.ensure([{ key, id }], signal);
            if (report.master !== "conflict") {
              log.warning("re-created deleted master key of ID {id} ({key}), still in use here", {
                id,
                key,
              });
              return;
            }
            log.error("cannot re-create master of ID {id} for {key}: the ID or key is taken", {
              id,
              key,
            });
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
    this.#checkWritable("allocate");
    const k = this.#encode(key);
    const held = this.#local.get(k);
    if (held) {
      held.refcnt++;
      return { id: held.id, isNew: false, firstUse: false };
    }
    this.#backend.checkKey(k);
    const signal = this.#signal(options);
    await this.waitForInitialSync({ signal });
    using _lock = await this.#mutex.lock(k, signal);
    const again = this.#local.get(k);
    if (again) {
      again.refcnt++;
      return { id: again.id, isNew: false, firstUse: false };
    }
    let lastError: unknown;
    for (let attempt = 0; attempt < this.#settings.maxAttempts; attempt++) {
      if (attempt > 0) await sleep(backoffDelay(this.#settings.backoff, attempt - 1), signal);
      signal.throwIfAborted();
      const leased: number[] = [];
      try {
        const hint = this.#cache.lookup(k);
        const result = await this.#session.acquire({
          key: k,
          hint: hint?.version !== undefined ? { id: hint.id, version: hint.version } : undefined,
          pickCandidate: (exclude) => {
            const unmasked = this.#pool.lease(k, this.#unmaskSet(exclude));
            if (unmasked === undefined) return undefined;
            leased.push(unmasked);
            return applyMask(unmasked, this.#settings.prefixMask);
          },
          range: this.#gcRange,
          signal,
        });
        const id = this.#validId(result.id, k);
        this.#local.add(k, id);
        this.#pendingReleases.delete(k);
        this.#pool.remove(this.#unmask(id));
        this.#cache.insertLocal(k, id, result.version);
        return { id, isNew: result.created, firstUse: true };
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
        log.debug("allocation attempt {attempt} for {key} failed: {err}", { attempt, key: k, err });
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
    if (!Number.isSafeInteger(id) || id <= 0) {
      throw new InvalidIdError(`store returned invalid ID ${id} for key '${key}'`);
    }
    return id;
  }

  /**
   * Drops one local reference to `key`. On the last local use the node's reference is removed from
   * the store (`lastUse: true`); the ID's master stays until GC. Throws {@linkcode KeyNotHeldError}
   * for a key this allocator does not hold.
   */
  async release(key: K, options?: CallOptions): Promise<ReleaseResult> {
    this.#checkWritable("release");
    const k = this.#encode(key);
    const signal = this.#signal(options);
    await this.waitForInitialSync({ signal });
    using _lock = await this.#mutex.lock(k, signal);
    const entry = this.#local.get(k);
    if (!entry) throw new KeyNotHeldError(k);
    if (!this.#local.release(k)) return { lastUse: false };
    try {
      await this.#session.release(k, entry.id, signal);
    } catch (err) {
      // The local hold is gone either way; the sync keeps trying to delete the reference so it
      // cannot pin the ID forever.
      this.#pendingReleases.set(k, entry.id);
      log.warning("could not delete reference of {key}; will retry: {err}", { key: k, err });
    }
    return { lastUse: true };
  }

  /** The ID of `key` from the cache, else from the store; `undefined` if it has none. */
  async get(key: K, options?: CallOptions): Promise<number | undefined> {
    this.#checkOpen();
    const k = this.#encode(key);
    const cached = this.#local.get(k)?.id ?? this.#cache.lookup(k)?.id;
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

  /** The cached ID of `key` (no store access). */
  cachedId(key: K): number | undefined {
    const k = this.#encode(key);
    return this.#local.get(k)?.id ?? this.#cache.lookup(k)?.id;
  }

  /** The cached key of `id` (no store access). */
  cachedKey(id: number): K | undefined {
    return this.#cache.entry(id)?.value;
  }

  /** Every cached `[id, key]` mapping (Cilium's `ForeachCache`). */
  *entries(): IterableIterator<[number, K]> {
    for (const [id, entry] of this.#cache.entries()) yield [id, entry.value];
  }

  /**
   * Streams the cache: every cached mapping as an `upsert`, then one `synced`, then live
   * `upsert`/`delete` events until `signal` aborts or the allocator closes.
   *
   * Each call has its own unbounded queue: a slow consumer never blocks allocation or other
   * consumers, and loses no event; its queue (see `status().queuedEvents`) grows instead.
   */
  async *watch(options?: CallOptions): AsyncGenerator<AllocatorEvent<K>> {
    this.#checkOpen();
    const signal = this.#signal(options);
    await this.waitForInitialSync({ signal });
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
    return await this.#gc.run(this.#signal(options));
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
          await this.#syncHeld(reason);
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
    for (const [key, id] of [...this.#pendingReleases]) {
      using _lock = await this.#mutex.lock(key, signal);
      if (this.#local.get(key) || this.#pendingReleases.get(key) !== id) continue;
      await this.#session.release(key, id, signal);
      this.#pendingReleases.delete(key);
    }
    const held = this.#local.snapshot().sort((a, b) => (a.key < b.key ? -1 : 1));
    for (let i = 0; i < held.length; i += SYNC_BATCH) {
      const batch = held.slice(i, i + SYNC_BATCH);
      // Locks in key order: one consistent order, so no deadlock with single-key holders.
      const locks: Disposable[] = [];
      try {
        for (const { key } of batch) locks.push(await this.#mutex.lock(key, signal));
        // Re-check under the locks: a key released since the snapshot must not be re-created.
        const still: HeldKey[] = batch.filter(({ key, id }) => this.#local.get(key)?.id === id);
        if (still.length === 0) continue;
        for (const report of await this.#session.ensure(still, signal)) {
          if (report.master === "recreated" || report.reference === "recreated") {
            log.warning("re-created missing {what} of {key} (ID {id}) [{reason}]", {
              what: report.master === "recreated" ? "master and reference" : "reference",
              key: report.key,
              id: report.id,
              reason,
            });
          } else if (report.master === "conflict") {
            log.error("held key {key} (ID {id}) conflicts with the store", { ...report });
          }
        }
      } finally {
        for (const lock of locks) lock[Symbol.dispose]();
      }
    }
  }

  /** Counters and the session's health. */
  status(): AllocatorStatus {
    let queued = 0;
    for (const queue of this.#subscribers) queued += queue.length;
    return {
      heldKeys: this.#local.size,
      cachedIds: this.#cache.size,
      synced: this.#synced,
      availableIds: this.#pool.available,
      queuedEvents: queued,
      session: this.#session.status(),
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
