/**
 * The pool of IDs an allocator may hand out, after Cilium's `pkg/idpool`.
 *
 * Every ID in `[min, max]` is available, leased (a candidate being tried right now) or
 * unavailable (the store has a master for it). Unlike Cilium, `insert` is bounds-checked: a delete
 * event for an ID outside the range never makes that ID allocatable.
 *
 * @module
 */

/** FNV-1a over UTF-16 code units: a stable hash, the same on every node and runtime. */
export function keyHash(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) {
    h ^= key.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return h >>> 0;
}

/** IDs in `[min, max]` with their state; selection is hinted by a hash of the key. */
export class IdPool {
  readonly #min: number;
  readonly #max: number;
  readonly #unavailable = new Set<number>();
  readonly #leased = new Set<number>();

  /** @param min lowest ID; @param max highest ID (inclusive) */
  constructor(min: number, max: number) {
    this.#min = min;
    this.#max = max;
  }

  /** Number of IDs in the range. */
  get size(): number {
    return this.#max - this.#min + 1;
  }

  /** Number of IDs neither leased nor unavailable. */
  get available(): number {
    return this.size - this.#unavailable.size - this.#leased.size;
  }

  /** Whether `id` lies in the pool's range. */
  contains(id: number): boolean {
    return id >= this.#min && id <= this.#max;
  }

  /**
   * Leases an available ID, starting the search at a position derived from `hint` (a key), so that
   * nodes racing on one key pick the same candidate and different keys spread out. IDs in
   * `exclude` are skipped. Returns `undefined` when none is available.
   */
  lease(hint: string, exclude?: ReadonlySet<number>): number | undefined {
    const size = this.size;
    if (this.available <= 0) return undefined;
    const start = keyHash(hint) % size;
    for (let step = 0; step < size; step++) {
      const id = this.#min + ((start + step) % size);
      if (this.#unavailable.has(id) || this.#leased.has(id) || exclude?.has(id)) continue;
      this.#leased.add(id);
      return id;
    }
    return undefined;
  }

  /** Returns a leased ID to the available set. True if it was leased. */
  release(id: number): boolean {
    return this.#leased.delete(id);
  }

  /** Turns a leased ID unavailable (its master was written). True if it was leased. */
  use(id: number): boolean {
    if (!this.#leased.delete(id)) return false;
    this.#unavailable.add(id);
    return true;
  }

  /** Makes an unavailable ID available again (its master is gone). False outside the range. */
  insert(id: number): boolean {
    if (!this.contains(id)) return false;
    return this.#unavailable.delete(id);
  }

  /**
   * Marks an ID unavailable (a master exists for it). True if it was available; a leased ID
   * becomes unavailable and its lease is dropped (returns false, as Cilium).
   */
  remove(id: number): boolean {
    if (!this.contains(id) || this.#unavailable.has(id)) return false;
    this.#unavailable.add(id);
    return !this.#leased.delete(id);
  }
}
