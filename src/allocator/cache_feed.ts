/**
 * The cache feed: the session's watch feeding the ID cache, the pool and every `watch()` stream.
 *
 * A (re)started watch re-lists the store: IDs the list does not show again before `synced` have
 * vanished and are deleted from the cache (unless changed since the list began). Each subscriber
 * has its own unbounded queue, so a slow consumer never blocks the feed or other consumers.
 *
 * The feed decides nothing about held keys: it tells the {@linkcode FeedHooks} its watch runs
 * for (the re-check) when the store contradicts one (`conflict`) or deletes the master of one
 * (`deletedHeld`). They are given to {@linkcode CacheFeed.run}, not to the constructor: the
 * re-check is built after the feed, which it uses.
 *
 * @module
 */
import { abortable, sleep } from "../abort.ts";
import type { BackendEvent, BackendSession } from "./backend.ts";
import { type Backoff, backoffDelay } from "./backoff.ts";
import type { CacheChange, IdCache } from "./cache.ts";
import { EventQueue } from "./event_queue.ts";
import type { IdPool } from "./id_pool.ts";
import type { IdSpace } from "./id_space.ts";
import type { LocalKeys } from "./local_keys.ts";
import type { AllocatorEvent, CacheValidator, KeyCodec } from "./types.ts";
import { idallocLogger } from "../log.ts";
import { IdallocError } from "../errors.ts";
import type { AllocatorTelemetry } from "../telemetry/allocator.ts";

const log = idallocLogger("allocator");

/** What the feed tells its owner about held keys. */
export interface FeedHooks {
  /** The store shows held `key`'s ID under another key, or the key under another ID. */
  conflict(key: string, why: string): void;
  /**
   * The master of `id`, which this node holds for `key`, was deleted. Returns whether the owner
   * keeps the ID (master-key protection re-creates it): then consumers are shown no delete.
   */
  deletedHeld(key: string, id: number): boolean;
}

/** What the feed works with. */
export interface FeedParts<K> {
  readonly session: Pick<BackendSession, "watch">;
  readonly cache: IdCache<K>;
  readonly pool: IdPool;
  readonly space: IdSpace;
  readonly local: LocalKeys;
  readonly codec: KeyCodec<K>;
  readonly validator?: CacheValidator;
  readonly backoff: Backoff;
  readonly telemetry: Pick<AllocatorTelemetry, "watched" | "reconnect" | "synced">;
}

/** The watch loop and the subscribers of one allocator (see the module doc). */
export class CacheFeed<K> {
  readonly #p: FeedParts<K>;
  readonly #subscribers = new Set<EventQueue<AllocatorEvent<K>>>();
  #synced = false;
  readonly #syncedSignal = Promise.withResolvers<void>();
  /**
   * The last watch failure while it is one that retrying cannot fix (`retryable: false`: the
   * store denies access, the backend closed): waiting for the initial list then fails with it at
   * once instead of at the caller's deadline. The watch keeps retrying; a list clears it.
   */
  #fatal: IdallocError | undefined;
  readonly #failWaiters = new Set<(err: unknown) => void>();

  /** A feed over `parts`; nothing runs until {@linkcode CacheFeed.run}. */
  constructor(parts: FeedParts<K>) {
    this.#p = parts;
    // Nobody may be left waiting on a sync that will never come.
    this.#syncedSignal.promise.catch(() => {});
  }

  /** Whether the initial list has been received. */
  get synced(): boolean {
    return this.#synced;
  }

  /** Events waiting in subscribers' queues. */
  get queued(): number {
    let queued = 0;
    for (const queue of this.#subscribers) queued += queue.length;
    return queued;
  }

  /**
   * Resolves once the initial list is in the cache; rejects when `signal` aborts, or with the
   * watch's failure when it is one that retrying cannot fix (see `#fatal`).
   */
  async waitForInitialSync(signal: AbortSignal): Promise<void> {
    if (this.#synced) return;
    if (this.#fatal !== undefined) throw this.#fatal;
    const failed = Promise.withResolvers<never>();
    this.#failWaiters.add(failed.reject);
    try {
      await abortable(Promise.race([this.#syncedSignal.promise, failed.promise]), signal);
    } finally {
      this.#failWaiters.delete(failed.reject);
    }
  }

  /** Fails every wait for the initial list: the allocator closed. */
  close(reason: unknown): void {
    this.#syncedSignal.reject(reason);
  }

  /**
   * Watches the store until `signal` aborts, restarting a failed watch with backoff; `hooks` hear
   * about held keys.
   */
  async run(signal: AbortSignal, hooks: FeedHooks): Promise<void> {
    for (let attempt = 0; !signal.aborted; attempt++) {
      // A (re)started watch re-lists: IDs not seen again before `synced` have vanished.
      const seen = new Set<number>();
      const listedFrom = this.#p.cache.mark();
      let listing = true;
      try {
        for await (const event of this.#p.telemetry.watched(this.#p.session.watch(signal))) {
          if (event.type === "synced") {
            if (listing) {
              listing = false;
              for (const [id] of [...this.#p.cache.entries()]) {
                if (!seen.has(id) && this.#p.cache.unlisted(id, listedFrom)) {
                  this.#onDelete(id, hooks);
                }
              }
            }
            attempt = 0;
            this.#markSynced();
            continue;
          }
          if (listing) seen.add(event.id);
          this.#onEvent(event, hooks);
        }
        if (signal.aborted) return;
        log.warning("store watch ended; restarting it");
      } catch (err) {
        if (signal.aborted) return;
        this.#p.telemetry.reconnect(err);
        log.warning("store watch failed, restarting: {err}", { err });
        if (err instanceof IdallocError && !err.retryable) {
          this.#fatal = err;
          for (const fail of this.#failWaiters) fail(err);
        }
      }
      await sleep(backoffDelay(this.#p.backoff, attempt) + 50, signal).catch(() => {});
    }
  }

  #markSynced(): void {
    this.#fatal = undefined;
    if (this.#synced) return;
    this.#synced = true;
    this.#syncedSignal.resolve();
    this.#p.telemetry.synced();
  }

  #onEvent(event: Exclude<BackendEvent, { type: "synced" }>, hooks: FeedHooks): void {
    if (event.type === "delete") return this.#onDelete(event.id, hooks);
    const { cache, codec, local } = this.#p;
    const reason = this.#p.validator?.({ type: "upsert", id: event.id, key: event.key });
    if (reason !== undefined) {
      log.warning("skipping event for invalid ID {id}: {reason}", { id: event.id, reason });
      return;
    }
    let value: K;
    try {
      value = codec.decode(event.key);
    } catch (err) {
      log.warning("skipping ID {id}: its key cannot be decoded: {err}", { id: event.id, err });
      return;
    }
    this.#p.pool.remove(this.#p.space.unmask(event.id));
    this.publish(cache.upsert(event.id, event.key, value, event.version));
    const holder = local.keyOf(event.id);
    if (holder !== undefined && holder !== event.key) {
      hooks.conflict(holder, `ID ${event.id} now belongs to '${event.key}'`);
    }
    // A second master of a held key: on etcd possibly a leftover, but worth one re-check.
    const held = local.get(event.key);
    if (held !== undefined && held.id !== event.id) {
      hooks.conflict(event.key, `the store also maps it to ID ${event.id}`);
    }
  }

  #onDelete(id: number, hooks: FeedHooks): void {
    const cached = this.#p.cache.entry(id);
    const reason = this.#p.validator?.({ type: "delete", id, key: cached?.key });
    if (reason !== undefined) {
      log.warning("skipping delete of invalid ID {id}: {reason}", { id, reason });
      return;
    }
    const heldKey = this.#p.local.keyOf(id);
    if (heldKey !== undefined && hooks.deletedHeld(heldKey, id)) return;
    this.forget(id);
  }

  /** Drops `id` from the cache and returns it to the pool, telling subscribers. */
  forget(id: number): void {
    this.#p.pool.insert(this.#p.space.unmask(id));
    this.publish(this.#p.cache.delete(id));
  }

  /** Records this node's own acquisition of `key` as `id` at once (see `IdCache.insertLocal`). */
  insertLocal(key: string, id: number, version: string | undefined): void {
    this.#p.pool.remove(this.#p.space.unmask(id));
    this.publish(this.#p.cache.insertLocal(key, id, version));
  }

  /** Tells every subscriber of a cache change. */
  publish(change: CacheChange<K> | undefined): void {
    if (!change) return;
    for (const queue of this.#subscribers) queue.push(change);
  }

  /** Tells every subscriber of an event that is not a cache change (`reassigned`). */
  announce(event: AllocatorEvent<K>): void {
    for (const queue of this.#subscribers) queue.push(event);
  }

  /**
   * Streams the cache to one subscriber: every cached mapping as an `upsert`, one `synced`, then
   * live events until `signal` aborts.
   */
  async *subscribe(signal: AbortSignal): AsyncGenerator<AllocatorEvent<K>> {
    const queue = new EventQueue<AllocatorEvent<K>>();
    // Replay and subscription happen in one synchronous step, so no change falls between them.
    for (const [id, entry] of this.#p.cache.entries()) {
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
}
