/**
 * The watch-fed cache of every ID ↔ key mapping in the store. It is a hint for choosing IDs and
 * answering lookups, never proof of anything: every write is guarded by the store's atomic check.
 *
 * @module
 */

/** One cached mapping. */
export interface CacheEntry<K> {
  /** The encoded key. */
  readonly key: string;
  /** The decoded key. */
  readonly value: K;
  /** The master's version (opaque; a hint for the backend). */
  readonly version: string;
}

/** A change of the cache that subscribers see. */
export type CacheChange<K> =
  | { readonly type: "upsert"; readonly id: number; readonly key: K }
  | { readonly type: "delete"; readonly id: number; readonly key: K };

/** ID → key and key → ID, fed by the backend's watch and by this node's own allocations. */
export class IdCache<K> {
  readonly #byId = new Map<number, CacheEntry<K>>();
  /** The newest master of each key. */
  readonly #byKey = new Map<string, number>();
  /**
   * Every master of the keys that have more than one (a second master: Cilium's, a leftover, or
   * garbage). Rare, so kept apart from `#byKey`; the fence's re-check asks it.
   */
  readonly #shared = new Map<string, Set<number>>();
  /**
   * Mappings this node allocated that the watch has not echoed yet. Kept apart so that the echo
   * still reaches subscribers as an upsert (Cilium's `insert` emits nothing; the watch does).
   */
  readonly #pending = new Map<string, { id: number; version?: string }>();

  /** Number of cached IDs. */
  get size(): number {
    return this.#byId.size;
  }

  /** The cached ID of encoded key `key`, with its version if known. */
  lookup(key: string): { id: number; version?: string } | undefined {
    const id = this.#byKey.get(key);
    if (id !== undefined) return { id, version: this.#byId.get(id)?.version };
    return this.#pending.get(key);
  }

  /** Cached IDs other than `id` whose master names encoded key `key` (a second master). */
  otherIds(key: string, id: number): number[] {
    const all = this.#shared.get(key);
    if (all) return [...all].filter((other) => other !== id);
    const only = this.#byKey.get(key);
    return only === undefined || only === id ? [] : [only];
  }

  /** The cached entry of `id`. */
  entry(id: number): CacheEntry<K> | undefined {
    return this.#byId.get(id);
  }

  /** Every cached mapping. */
  entries(): IterableIterator<[number, CacheEntry<K>]> {
    return this.#byId.entries();
  }

  /** Remembers this node's own fresh allocation until the watch reports it. */
  insertLocal(key: string, id: number, version?: string): void {
    if (this.#byKey.get(key) === id) return;
    this.#pending.set(key, { id, version });
  }

  /** Applies an upsert; returns the change to publish, or undefined if nothing changed. */
  upsert(id: number, key: string, value: K, version: string): CacheChange<K> | undefined {
    this.#pending.delete(key);
    const old = this.#byId.get(id);
    this.#byId.set(id, { key, value, version });
    if (old && old.key !== key) this.#unlink(old.key, id);
    this.#link(key, id);
    if (old && old.key === key) return undefined;
    return { type: "upsert", id, key: value };
  }

  /** Applies a delete; returns the change to publish, or undefined if `id` was not cached. */
  delete(id: number): CacheChange<K> | undefined {
    for (const [key, pending] of this.#pending) {
      if (pending.id === id) this.#pending.delete(key);
    }
    const old = this.#byId.get(id);
    if (!old) return undefined;
    this.#byId.delete(id);
    this.#unlink(old.key, id);
    return { type: "delete", id, key: old.value };
  }

  /** `id`'s master names `key`: it becomes the key's newest master. */
  #link(key: string, id: number): void {
    const current = this.#byKey.get(key);
    this.#byKey.set(key, id);
    if (current === undefined || current === id) return;
    let all = this.#shared.get(key);
    if (!all) this.#shared.set(key, all = new Set([current]));
    all.add(id);
  }

  /** `id`'s master no longer names `key`: another master of the key, if any, stands for it. */
  #unlink(key: string, id: number): void {
    const all = this.#shared.get(key);
    if (all?.delete(id)) {
      if (this.#byKey.get(key) === id) this.#byKey.set(key, [...all].at(-1)!);
      if (all.size === 1) this.#shared.delete(key);
      return;
    }
    if (this.#byKey.get(key) === id) this.#byKey.delete(key);
  }
}
