/**
 * Node-local identities (Cilium's `localIdentityCache`): reference-counted, numbered
 * `scope | n` with `n` handed out sequentially from `min` to `max` with wrap-around, skipping IDs in
 * use and withheld IDs; a previously used ID can be requested back. Never touches the store.
 *
 * @module
 */
import { PoolExhaustedError } from "../errors.ts";
import { idallocLogger } from "../log.ts";
import type { Labels } from "./labels.ts";
import { MAX_LOCAL_IDENTITY, MIN_LOCAL_IDENTITY, scopeOf } from "./numeric.ts";
import type { Identity } from "./types.ts";

const log = idallocLogger("identity", "local");

/** A change a local cache reports to its owner. */
export type LocalIdentityEvent =
  | { readonly type: "upsert"; readonly id: number; readonly labels: Labels }
  | { readonly type: "delete"; readonly id: number };

/** Options of {@linkcode LocalIdentityCache}. */
export interface LocalIdentityCacheOptions {
  /** The scope bits ORed into every ID, e.g. `IdentityScope.Local`. */
  readonly scope: number;
  /** Lowest value before the scope. @default {1} */
  readonly min?: number;
  /** Highest value before the scope. @default {0xFFFFFF} */
  readonly max?: number;
  /** Receives creations and last releases made with `notify`. */
  readonly onChange?: (event: LocalIdentityEvent) => void;
}

interface Entry {
  readonly identity: Identity;
  refs: number;
}

/** One scope's node-local identities. */
export class LocalIdentityCache {
  /** The scope bits of every ID handed out. */
  readonly scope: number;
  /** Lowest value before the scope. */
  readonly min: number;
  /** Highest value before the scope. */
  readonly max: number;
  readonly #onChange?: (event: LocalIdentityEvent) => void;
  readonly #byId = new Map<number, Entry>();
  readonly #byLabels = new Map<string, Entry>();
  /** IDs kept free for restoration (Cilium's `withheldIdentities`); insertion-ordered. */
  readonly #withheld = new Set<number>();
  #next: number;

  /** Creates an empty cache. @param options scope, range and change callback */
  constructor(options: LocalIdentityCacheOptions) {
    this.scope = options.scope >>> 0;
    this.min = options.min ?? MIN_LOCAL_IDENTITY;
    this.max = options.max ?? MAX_LOCAL_IDENTITY;
    this.#onChange = options.onChange;
    this.#next = this.min;
  }

  /** The value (before the scope) the next sequential scan starts at. */
  get nextValue(): number {
    return this.#next;
  }

  /** Number of identities held. */
  get size(): number {
    return this.#byId.size;
  }

  #bump(): void {
    this.#next = this.#next === this.max ? this.min : this.#next + 1;
  }

  #nextFree(candidate: number): number {
    // A requested ID is honoured whenever it is in scope and free, even if withheld (that is how
    // withheld IDs are restored) and even with zero low bits (a Cilium quirk kept on purpose).
    if (scopeOf(candidate) === this.scope && !this.#byId.has(candidate)) return candidate;
    const first = this.#next;
    while (true) {
      const id = (this.#next | this.scope) >>> 0;
      const free = !this.#byId.has(id) && !this.#withheld.has(id);
      this.#bump();
      if (free) return id;
      if (this.#next === first) break;
    }
    for (const id of this.#withheld) {
      if (!this.#byId.has(id)) {
        this.#withheld.delete(id);
        log.warning(
          "Local identity allocator full; claiming first withheld identity {id}. This may cause momentary policy drops",
          { id },
        );
        return id;
      }
    }
    throw new PoolExhaustedError((this.scope | this.min) >>> 0, (this.scope | this.max) >>> 0);
  }

  /**
   * The identity of `labels`, creating it if absent, and one more reference to it. `oldId` is
   * reused if it is in this scope and free. Throws {@linkcode PoolExhaustedError} when the scope
   * is full ("out of local identity space").
   */
  lookupOrCreate(
    labels: Labels,
    oldId = 0,
    notify = true,
  ): { identity: Identity; isNew: boolean } {
    const repr = labels.toKvstoreString();
    const existing = this.#byLabels.get(repr);
    if (existing) {
      existing.refs++;
      return { identity: existing.identity, isNew: false };
    }
    const id = this.#nextFree(oldId);
    const entry: Entry = { identity: Object.freeze({ id, labels }), refs: 1 };
    this.#byLabels.set(repr, entry);
    this.#byId.set(id, entry);
    if (notify) this.#onChange?.({ type: "upsert", id, labels });
    return { identity: entry.identity, isNew: true };
  }

  /**
   * Drops one reference to identity `id`. Returns true when that was the last one and the
   * identity is gone; false while references remain or for an unknown ID.
   */
  release(id: number, notify = true): boolean {
    const entry = this.#byId.get(id);
    if (!entry) return false;
    if (entry.refs > 1) {
      entry.refs--;
      return false;
    }
    this.#byId.delete(id);
    this.#byLabels.delete(entry.identity.labels.toKvstoreString());
    if (notify) this.#onChange?.({ type: "delete", id });
    return true;
  }

  /** The identity of `labels`, if held. */
  lookup(labels: Labels): Identity | undefined {
    return this.#byLabels.get(labels.toKvstoreString())?.identity;
  }

  /** The identity `id`, if held. */
  lookupById(id: number): Identity | undefined {
    return this.#byId.get(id)?.identity;
  }

  /** Marks in-scope `ids` unavailable to the sequential scan; returns the out-of-scope ones. */
  withhold(ids: Iterable<number>): number[] {
    const foreign: number[] = [];
    for (const id of ids) {
      if (scopeOf(id) !== this.scope) foreign.push(id);
      else this.#withheld.add(id);
    }
    return foreign;
  }

  /** Makes in-scope `ids` available again. */
  unwithhold(ids: Iterable<number>): void {
    for (const id of ids) {
      if (scopeOf(id) === this.scope) this.#withheld.delete(id);
    }
  }

  /** Every identity held. */
  *entries(): IterableIterator<Identity> {
    for (const entry of this.#byId.values()) yield entry.identity;
  }
}
