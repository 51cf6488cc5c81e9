/**
 * The fence: which held keys this node may not answer from memory right now.
 *
 * A node's claim on a key is its reference in the store, kept alive by its lease. When the node
 * cannot prove that claim any more — its lease lapsed before it could renew (a stall), the lease
 * was replaced or revoked, or the store shows a held key's ID under another key — every answer it
 * would give from memory is suspect until the store has been re-checked. The fence records what
 * is suspect and since when; the allocator re-checks (and, where the ID was taken, re-acquires)
 * and clears it.
 *
 * Raising and clearing are ordered by a generation number: a re-check clears only what was raised
 * before it started, so a lapse that happens during a re-check is never cleared by it.
 *
 * @example A lapse makes every held key suspect until a re-check that started after it
 * ```ts
 * import assert from "node:assert/strict";
 * import { Fence } from "./fence.ts";
 * const fence = new Fence();
 * fence.raiseAll("lease lapsed");
 * const gen = fence.generation;
 * assert.equal(fence.isSuspect("k"), true);
 * fence.verified("k", gen);
 * assert.equal(fence.isSuspect("k"), false);
 * assert.equal(fence.isSuspect("other"), true); // the rest stay suspect until the pass completes
 * fence.passCompleted(gen);
 * assert.equal(fence.active, false);
 * ```
 *
 * @module
 */

/** What made the fence go up, for status and logs. */
export type FenceReason = "lease lapsed" | "lease replaced" | "conflict";

/** Counters and state of the fence. */
export interface FenceStatus {
  /** Whether some held key is suspect right now. */
  readonly active: boolean;
  /** Held keys explicitly suspect (a conflict); every held key is, while `all` is true. */
  readonly suspectKeys: number;
  /** Whether every held key is suspect (the lease lapsed or was replaced). */
  readonly all: boolean;
  /** When the current fence went up (ms since epoch), if it is up. */
  readonly since?: number;
  /** Why it went up last. */
  readonly lastReason?: FenceReason;
  /** Times the lease lapsed before it could be renewed. */
  readonly lapses: number;
  /** Times the lease was replaced (lost, revoked, or renewed too late). */
  readonly replacements: number;
  /** Times the store showed a held key's ID under another key, or the key under another ID. */
  readonly conflicts: number;
  /** Held keys re-acquired under a new ID. */
  readonly reassigned: number;
}

/** Which held keys are suspect, ordered by generations. */
export class Fence {
  #generation = 0;
  /** Generation of the outstanding "every key" raise; 0 when none. */
  #allAt = 0;
  /** Outstanding per-key raises. */
  readonly #keyAt = new Map<string, number>();
  /** Per-key verifications since the outstanding "every key" raise. */
  readonly #okAt = new Map<string, number>();
  readonly #waiters = new Set<() => void>();
  #since: number | undefined;
  #lastReason: FenceReason | undefined;
  #lapses = 0;
  #replacements = 0;
  #conflicts = 0;
  #reassigned = 0;
  /** Kept as a plain field: the cached-allocation path reads it on every call. */
  active = false;

  /** The generation of the newest raise; a re-check passes it back when it is done. */
  get generation(): number {
    return this.#generation;
  }

  /** Whether `key` (a held key) is suspect. */
  isSuspect(key: string): boolean {
    if (!this.active) return false;
    const ok = this.#okAt.get(key) ?? 0;
    if (this.#allAt > ok) return true;
    const at = this.#keyAt.get(key);
    return at !== undefined && at > ok;
  }

  /**
   * Every held key is suspect (the lease lapsed or was replaced). A lapse raised again while the
   * fence is already up for every key counts once. Returns whether this raise was counted.
   */
  raiseAll(reason: "lease lapsed" | "lease replaced"): boolean {
    const counted = reason === "lease replaced" || this.#allAt === 0;
    if (counted && reason === "lease lapsed") this.#lapses++;
    if (reason === "lease replaced") this.#replacements++;
    this.#allAt = this.#raise(reason);
    return counted;
  }

  /**
   * `key` is suspect: the store showed its ID under another key, or it under another ID. Returns
   * the raise's generation (a re-check that proves the key must have started at or after it).
   */
  raise(key: string): number {
    const gen = this.#raise("conflict");
    if (!this.#keyAt.has(key)) this.#conflicts++;
    this.#keyAt.set(key, gen);
    return gen;
  }

  #raise(reason: FenceReason): number {
    this.#lastReason = reason;
    if (!this.active) this.#since = Date.now();
    this.active = true;
    return ++this.#generation;
  }

  /** A re-check that started at generation `gen` proved `key` (or re-acquired it). */
  verified(key: string, gen: number): void {
    if (!this.active) return;
    this.#okAt.set(key, Math.max(gen, this.#okAt.get(key) ?? 0));
    const at = this.#keyAt.get(key);
    if (at !== undefined && at <= gen) this.#keyAt.delete(key);
    this.#settle();
  }

  /** Counts a key re-acquired under a new ID. */
  reassigned(): void {
    this.#reassigned++;
  }

  /** `key` is no longer held: nothing about it can be suspect. */
  forget(key: string): void {
    this.#keyAt.delete(key);
    this.#okAt.delete(key);
    this.#settle();
  }

  /**
   * A re-check that started at generation `gen` went over every held key and the node's claim is
   * valid again: what was raised for every key before it is cleared.
   */
  passCompleted(gen: number): void {
    if (this.#allAt !== 0 && this.#allAt <= gen) {
      this.#allAt = 0;
      this.#okAt.clear();
    }
    this.#settle();
  }

  #settle(): void {
    if (!this.active) return;
    if (this.#allAt === 0 && this.#keyAt.size === 0) {
      this.active = false;
      this.#since = undefined;
      this.#okAt.clear();
    }
    for (const wake of [...this.#waiters]) wake();
  }

  /**
   * Resolves once `key` is no longer suspect (or, without a key, once the fence is down); rejects
   * with `signal.reason` when it aborts first.
   */
  async until(key: string | undefined, signal: AbortSignal): Promise<void> {
    const clear = () => key === undefined ? !this.active : !this.isSuspect(key);
    while (!clear()) {
      signal.throwIfAborted();
      await new Promise<void>((resolve, reject) => {
        const wake = () => {
          this.#waiters.delete(wake);
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        const onAbort = () => {
          this.#waiters.delete(wake);
          reject(signal.reason);
        };
        this.#waiters.add(wake);
        signal.addEventListener("abort", onAbort, { once: true });
      });
    }
  }

  /** Counters and state. */
  status(): FenceStatus {
    return {
      active: this.active,
      suspectKeys: this.#keyAt.size,
      all: this.#allAt !== 0,
      since: this.#since,
      lastReason: this.#lastReason,
      lapses: this.#lapses,
      replacements: this.#replacements,
      conflicts: this.#conflicts,
      reassigned: this.#reassigned,
    };
  }
}
