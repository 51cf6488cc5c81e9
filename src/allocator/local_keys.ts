/**
 * The keys this node holds, with local reference counts (Cilium's `localKeys`). Only keys whose
 * store reference has been written are entered, so every entry is "verified".
 *
 * @module
 */

/** One held key. */
export interface LocalKey {
  /** The ID the key is held with. */
  readonly id: number;
  /** Local uses not yet released. */
  refcnt: number;
}

/** Encoded key → held entry, with a reverse index by ID. */
export class LocalKeys {
  readonly #byKey = new Map<string, LocalKey>();
  readonly #byId = new Map<number, string>();

  /** Number of held keys. */
  get size(): number {
    return this.#byKey.size;
  }

  /** The entry for `key`, if held. */
  get(key: string): LocalKey | undefined {
    return this.#byKey.get(key);
  }

  /** The held key with ID `id`, if any. */
  keyOf(id: number): string | undefined {
    return this.#byId.get(id);
  }

  /** Enters `key` with one use. */
  add(key: string, id: number): void {
    this.#byKey.set(key, { id, refcnt: 1 });
    this.#byId.set(id, key);
  }

  /** Moves held `key` to ID `id`, keeping its uses (the key was re-acquired under a new ID). */
  rekey(key: string, id: number): void {
    const entry = this.#byKey.get(key);
    if (!entry) return;
    if (this.#byId.get(entry.id) === key) this.#byId.delete(entry.id);
    this.#byKey.set(key, { id, refcnt: entry.refcnt });
    this.#byId.set(id, key);
  }

  /** Drops one use; returns true when it was the last and the entry is gone. */
  release(key: string): boolean {
    const entry = this.#byKey.get(key);
    if (!entry) return false;
    entry.refcnt--;
    if (entry.refcnt > 0) return false;
    this.#byKey.delete(key);
    if (this.#byId.get(entry.id) === key) this.#byId.delete(entry.id);
    return true;
  }

  /** A snapshot of every held key and its ID. */
  snapshot(): Array<{ key: string; id: number }> {
    return [...this.#byKey].map(([key, { id }]) => ({ key, id }));
  }
}
