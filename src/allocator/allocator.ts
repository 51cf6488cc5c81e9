/**
 * The backend-agnostic allocator's public API. Its parts, each in a module of its own, receive
 * only what they need and are built in dependency order (`parts.ts`): the ID space
 * (`id_space.ts`), the cache feed (`cache_feed.ts`: the watch, the cache and `watch()` streams),
 * the deletions of this node's references (`deletions.ts`: queued, in flight, failed),
 * acquisition with its retry and lock-wait policy (`acquire.ts`), the re-check of held keys
 * (`recheck.ts`: claim timer, fencing, sync, reassignment, master-key protection), GC (`gc.ts`)
 * and the task group that stops them all.
 *
 * @example Allocate, look up and release on an embedded Deno KV store
 * ```ts
 * import assert from "node:assert/strict";
 * import { Allocator, DenoKvBackend } from "@idalloc/idalloc";
 *
 * using kv = await Deno.openKv(":memory:");
 * const backend = new DenoKvBackend(kv, { prefix: ["idalloc", "demo"], node: "node-a" });
 * await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *
 * const { id, isNew } = await alloc.allocate("app=web;");
 * assert.equal(isNew, true);
 * assert.ok(id >= 256 && id <= 65535);
 * assert.equal(await alloc.getById(id), "app=web;");
 * assert.deepEqual(await alloc.release("app=web;"), { lastUse: true });
 * ```
 *
 * @module
 */
import type { Backend, BackendSession } from "./backend.ts";
import { abortable } from "../abort.ts";
import type { FenceStatus } from "./fence.ts";
import { type AllocatorSettings, resolveOptions } from "./options.ts";
import { type AllocatorParts, buildParts, closeParts, startParts } from "./parts.ts";
import type {
  AllocateResult,
  AllocatorEvent,
  AllocatorOptions,
  CallOptions,
  GcStats,
  ReleaseResult,
} from "./types.ts";
import {
  ClosedError,
  InvalidIdError,
  InvalidKeyError,
  KeyNotHeldError,
  ReadOnlyError,
} from "../errors.ts";
import { idallocLogger } from "../log.ts";
import type { AllocationCounts, AllocatorGauges, ReleaseNote } from "../telemetry/allocator.ts";

const log = idallocLogger("allocator");

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
  readonly #settings: AllocatorSettings<K>;
  /** Every part, built in dependency order (see `parts.ts`). */
  readonly #p: AllocatorParts<K>;
  #closed: Promise<void> | undefined;

  private constructor(backend: Backend, session: BackendSession, settings: AllocatorSettings<K>) {
    this.#backend = backend;
    this.#settings = settings;
    this.#p = buildParts(backend, session, settings);
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
    const settings = resolveOptions(options, backend);
    // The session may report a lost lease before the allocator exists; nothing is held then.
    const opened: { allocator?: Allocator<K> } = {};
    const session = await backend.openSession({
      leaseTtlMs: settings.leaseTtlMs,
      readOnly: settings.readOnly,
      restart: settings.restart,
      gcGraceMs: settings.gcGraceMs,
      onLeaseReplaced: () => {
        if (opened.allocator) opened.allocator.#p.recheck.leaseReplaced();
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
    return { min: this.#p.space.min, max: this.#p.space.max };
  }

  #start(): void {
    this.#p.telemetry.open(() => this.#gauges());
    startParts(this.#p, this.#settings, async (signal) => {
      const stats = await this.runGc({ signal });
      log.debug("GC pass: {deleted} deleted, {marked} marked", { ...stats });
    });
  }

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
      this.#p.telemetry.failed(err);
      throw err;
    }
    const held = this.#p.local.get(k);
    if (held && this.#p.recheck.answersFromMemory()) {
      held.refcnt++;
      // The hot path's whole telemetry: a plain increment that an observable counter reports.
      this.#p.telemetry.cached++;
      return { id: held.id, isNew: false, firstUse: false };
    }
    return await this.#p.telemetry.allocation((trips) => this.#allocateStored(k, options, trips));
  }

  /** `allocate` past the cached answer: the key's lock, then the store. */
  async #allocateStored(
    k: string,
    options: CallOptions | undefined,
    trips: { count: number },
  ): Promise<AllocateResult> {
    this.#backend.checkKey(k);
    const { tasks, feed, local, fence, mutex, deletions, acquirer } = this.#p;
    const signal = tasks.bound(options?.signal);
    await feed.waitForInitialSync(signal);
    for (;;) {
      // Never wait on the fence while holding the key's lock: the re-check needs that lock.
      if (local.get(k) && fence.isSuspect(k)) await fence.until(k, signal);
      using _lock = await mutex.lock(k, signal);
      const again = local.get(k);
      if (again) {
        if (fence.isSuspect(k)) continue;
        again.refcnt++;
        return { id: again.id, isNew: false, firstUse: false };
      }
      // A deletion of this node's reference still queued or failed must not run after the
      // acquisition found that reference; one in flight must land first — within the call's
      // signal (a store that hangs would hold the call past it: the mixed nemesis, 12.5 s on a
      // 10 s signal while etcd was down). A call that gives up acquired nothing: the deletion
      // settle() cancelled is queued again.
      try {
        await abortable(deletions.settle(k), signal);
      } catch (err) {
        if (signal.aborted) deletions.abandoned(k);
        throw err;
      }
      const result = await acquirer.acquire(k, signal, undefined, trips);
      local.add(k, result.id);
      this.#p.recheck.heldAgain(k);
      return { id: result.id, isNew: result.created, firstUse: true };
    }
  }

  /**
   * Drops one local reference to `key`. On the last local use the node's reference is removed from
   * the store (`lastUse: true`); the ID's master stays until GC. Throws {@linkcode KeyNotHeldError}
   * for a key this allocator does not hold.
   *
   * With `releaseInBackground`, the last release returns before the reference's deletion lands:
   * see {@linkcode Allocator.flush}.
   */
  release(key: K, options?: CallOptions): Promise<ReleaseResult> {
    return this.#p.telemetry.release((note) => this.#release(key, options, note));
  }

  async #release(
    key: K,
    options: CallOptions | undefined,
    note: ReleaseNote,
  ): Promise<ReleaseResult> {
    this.#checkWritable("release");
    const k = this.#encode(key);
    const { tasks, feed, local, fence, mutex, deletions } = this.#p;
    const signal = tasks.bound(options?.signal);
    await feed.waitForInitialSync(signal);
    using _lock = await mutex.lock(k, signal);
    const entry = local.get(k);
    if (!entry) throw new KeyNotHeldError(k);
    if (!local.release(k)) return { lastUse: false };
    fence.forget(k);
    if (this.#settings.releaseInBackground) deletions.schedule(k, entry.id);
    // The local hold is gone either way; a deletion that fails is left to the sync, which keeps
    // trying so that the reference cannot pin the ID forever.
    else if (!await deletions.deleteNow(k, entry.id, signal)) note.deferred = true;
    return { lastUse: true };
  }

  /**
   * Waits until the deletion of every reference released so far has reached the store, or failed
   * and been left to the sync (which retries it). Only `releaseInBackground` defers deletions;
   * without it this returns as soon as deletions already in flight have. Call it where the store
   * must show a release, e.g. before another node's GC is expected to collect the ID.
   */
  async flush(options?: CallOptions): Promise<void> {
    this.#checkOpen();
    const signal = this.#p.tasks.bound(options?.signal);
    await abortable(this.#p.deletions.flush(), signal);
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
    const held = this.#p.local.get(k);
    if (held) {
      if (this.#p.recheck.answersFromMemory()) return held.id;
      await this.#p.fence.until(k, this.#p.tasks.bound(options?.signal));
      const now = this.#p.local.get(k);
      if (now) return now.id;
    }
    if (this.#p.fence.active) {
      return await this.#p.session.get(k, this.#p.tasks.bound(options?.signal));
    }
    const cached = this.#p.cache.lookup(k)?.id;
    if (cached !== undefined) return cached;
    return await this.#p.session.get(k, this.#p.tasks.bound(options?.signal));
  }

  /** The ID of `key` read from the store, bypassing the cache (Cilium's `GetNoCache`). */
  async getNoCache(key: K, options?: CallOptions): Promise<number | undefined> {
    this.#checkOpen();
    return await this.#p.session.get(this.#encode(key), this.#p.tasks.bound(options?.signal));
  }

  /** The key of `id` from the cache, else from the store; `undefined` if no master exists. */
  async getById(id: number, options?: CallOptions): Promise<K | undefined> {
    this.#checkOpen();
    if (!Number.isSafeInteger(id) || id <= 0) {
      throw new InvalidIdError(`ID ${id} is not a positive safe integer`);
    }
    const cached = this.#p.cache.entry(id);
    if (cached) return cached.value;
    const stored = await this.#p.session.getById(id, this.#p.tasks.bound(options?.signal));
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
    const held = this.#p.local.get(k);
    if (held) {
      return this.#p.recheck.answersFromMemory() || !this.#p.fence.isSuspect(k)
        ? held.id
        : undefined;
    }
    return this.#p.cache.lookup(k)?.id;
  }

  /** The cached key of `id` (no store access). */
  cachedKey(id: number): K | undefined {
    return this.#p.cache.entry(id)?.value;
  }

  /**
   * Every cached `[id, key]` mapping (Cilium's `ForeachCache`), leaving out the IDs of held keys
   * that are fenced and not re-checked yet.
   */
  *entries(): IterableIterator<[number, K]> {
    const fenced = this.#p.local.size > 0 && !this.#p.recheck.answersFromMemory();
    for (const [id, entry] of this.#p.cache.entries()) {
      if (fenced) {
        const holder = this.#p.local.keyOf(id);
        if (holder !== undefined && this.#p.fence.isSuspect(holder)) continue;
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
    const signal = this.#p.tasks.bound(options?.signal);
    await this.#p.feed.waitForInitialSync(signal);
    if (this.#p.fence.active) await this.#p.fence.until(undefined, signal);
    yield* this.#p.feed.subscribe(signal);
  }

  /** Resolves once the initial list of the store has been loaded into the cache. */
  async waitForInitialSync(options?: CallOptions): Promise<void> {
    await this.#p.feed.waitForInitialSync(this.#p.tasks.bound(options?.signal));
  }

  /**
   * One GC pass over `[min, max]`: deletes IDs that the previous pass found unused and that are
   * still unused and unchanged, marks newly unused ones. Rate-limited by `gcRateLimit`.
   */
  async runGc(options?: CallOptions): Promise<GcStats> {
    this.#checkWritable("runGc");
    const signal = this.#p.tasks.bound(options?.signal);
    return await this.#p.telemetry.gc(() => this.#p.gc.run(signal));
  }

  /**
   * Re-creates, for every key held here, a vanished reference or master, and retries reference
   * deletions that failed. Runs every `syncIntervalMs` and at once when the lease was replaced;
   * call it to force one.
   */
  async sync(options?: CallOptions): Promise<void> {
    this.#checkWritable("sync");
    await this.#p.recheck.requestSync("requested", options?.signal);
  }

  /** What the observable instruments report, and most of `status()`. */
  #gauges(session = this.#p.session.status()): AllocatorGauges {
    return {
      heldKeys: this.#p.local.size,
      cachedIds: this.#p.cache.size,
      availableIds: this.#p.pool.available,
      queuedEvents: this.#p.feed.queued,
      healthy: session.healthy && !this.#p.fence.active &&
        Date.now() < this.#p.session.claimValidUntil(),
      fence: this.#p.fence.status(),
    };
  }

  /** Counters and the session's health. */
  status(): AllocatorStatus {
    const session = this.#p.session.status();
    return {
      ...this.#gauges(session),
      synced: this.#p.feed.synced,
      allocations: this.#p.telemetry.counts(),
      session,
    };
  }

  /**
   * Lets released references' deletions land (`releaseInBackground`; at most 5 s), then stops the
   * watch, the sync and GC timers and the lease renewal, ends every `watch()` stream and closes the
   * backend session. Does not delete the references of keys still held (they lapse with the
   * lease). Idempotent.
   */
  close(): Promise<void> {
    this.#closed ??= closeParts(this.#p);
    return this.#closed;
  }

  /** Same as {@linkcode Allocator.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
