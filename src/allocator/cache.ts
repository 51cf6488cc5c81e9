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
  /**
   * The master's version (opaque; a hint for the backend); unknown for this node's own
   * allocation when the backend did not report it and the watch has not echoed it yet.
   */
  readonly version?: string;
}

/** A change of the cache that subscribers see. */
export type CacheChange<K> =
  | { readonly type: "upsert"; readonly id: number; readonly key: K }
  | { readonly type: "delete"; readonly id: number; readonly key: K };

/**
 * ID → key and key → ID, fed by the backend's watch and by this node's own allocations.
 *
 * A node's own allocation enters the cache (and reaches subscribers) when `allocate` resolves,
 * not when the watch echoes it a poll interval or a watch round trip later: a caller that lists
 * `entries()` or starts a `watch()` right after its `allocate` sees the mapping it was just given.
 * The echo then changes nothing that subscribers see (it only brings the master's version).
 * Cilium's `insert` shows the mapping only from the next watch event on; here no wait is needed.
 */
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
   * This node's own allocations that the watch has not echoed yet, by encoded key, with when
   * they were inserted (see {@linkcode IdCache.mark}).
   */
  readonly #unechoed = new Map<string, { id: number; seq: number }>();
  #seq = 0;

  readonly #decode: (key: string) => K;

  /** @param decode decodes an encoded key of this node's own allocations. */
  constructor(decode: (key: string) => K) {
    this.#decode = decode;
  }

  /** Number of cached IDs. */
  get size(): number {
    return this.#byId.size;
  }

  /** The cached ID of encoded key `key`, with its version if known. */
  lookup(key: string): { id: number; version?: string } | undefined {
    const id = this.#byKey.get(key);
    return id === undefined ? undefined : { id, version: this.#byId.get(id)?.version };
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

  /**
   * Inserts this node's own fresh allocation before the watch reports it; returns the change to
   * publish. A key the codec cannot decode waits for the watch (which logs and skips it).
   */
  insertLocal(key: string, id: number, version?: string): CacheChange<K> | undefined {
    if (this.#byKey.get(key) === id) return undefined;
    let value: K;
    try {
      value = this.#decode(key);
    } catch {
      return undefined;
    }
    this.#unechoed.set(key, { id, seq: ++this.#seq });
    return this.#set(id, key, value, version);
  }

  /**
   * A mark to take when a listing of the store starts: {@linkcode IdCache.unlisted} then tells
   * which cached IDs the listing should have shown.
   */
  mark(): number {
    return this.#seq;
  }

  /**
   * Whether `id` is missing from a listing that started at `mark` because it vanished: not when
   * it is this node's own allocation, inserted after the listing's snapshot may have been taken
   * and not echoed yet (the watch that follows the listing reports it, or its deletion).
   */
  unlisted(id: number, mark: number): boolean {
    const key = this.#byId.get(id)?.key;
    const own = key === undefined ? undefined : this.#unechoed.get(key);
    return own === undefined || own.id !== id || own.seq <= mark;
  }

  /** Applies an upsert; returns the change to publish, or undefined if nothing changed. */
  upsert(id: number, key: string, value: K, version: string): CacheChange<K> | undefined {
    this.#unechoed.delete(key);
    return this.#set(id, key, value, version);
  }

  #set(id: number, key: string, value: K, version?: string): CacheChange<K> | undefined {
    const old = this.#byId.get(id);
    this.#byId.set(id, { key, value, version });
    if (old && old.key !== key) this.#unlink(old.key, id);
    this.#link(key, id);
    if (old && old.key === key) return undefined;
    return { type: "upsert", id, key: value };
  }

  /** Applies a delete; returns the change to publish, or undefined if `id` was not cached. */
  delete(id: number): CacheChange<K> | undefined {
    const old = this.#byId.get(id);
    if (!old) return undefined;
    if (this.#unechoed.get(old.key)?.id === id) this.#unechoed.delete(old.key);
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
