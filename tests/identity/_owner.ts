/**
 * A test stand-in for Cilium's identity-allocator owner: consumes `changes()` and keeps the
 * resulting identity cache, so tests can wait for a state instead of sleeping.
 */
import assert from "node:assert/strict";
import type { IdentityAllocator, IdentityChange, Labels } from "../../src/identity/mod.ts";

export class Owner implements AsyncDisposable {
  readonly cache = new Map<number, Labels>();
  readonly batches: IdentityChange[] = [];
  readonly #controller = new AbortController();
  readonly #loop: Promise<void>;
  #waiters: Array<{ check: () => boolean; resolve: () => void }> = [];

  constructor(identities: IdentityAllocator, replay = true) {
    const stream = identities.changes({ signal: this.#controller.signal, replay });
    this.#loop = (async () => {
      for await (const batch of stream) {
        for (const id of batch.added.keys()) assert.ok(!batch.deleted.has(id), "added ∩ deleted");
        for (const [id, labels] of batch.added) this.cache.set(id, labels);
        for (const id of batch.deleted) this.cache.delete(id);
        this.batches.push(batch);
        this.#waiters = this.#waiters.filter((w) => (w.check() ? (w.resolve(), false) : true));
      }
    })();
  }

  /** Resolves once `check()` holds for the owner's state (checked after every batch). */
  until(check: () => boolean, what = "condition"): Promise<void> {
    if (check()) return Promise.resolve();
    const { promise, resolve, reject } = Promise.withResolvers<void>();
    this.#waiters.push({ check, resolve });
    // Only a guard against a hung test, not a timed assertion: nothing asserts how long it took.
    const guard = setTimeout(() => reject(new Error(`owner never saw: ${what}`)), 60_000);
    return promise.finally(() => clearTimeout(guard));
  }

  /** Resolves once the owner has identity `id` with labels equal to `labels`. */
  has(id: number, labels: Labels): Promise<void> {
    return this.until(() => this.cache.get(id)?.equals(labels) === true, `add ${id}`);
  }

  /** Resolves once the owner no longer has `id`. */
  lacks(id: number): Promise<void> {
    return this.until(() => !this.cache.has(id), `delete ${id}`);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#controller.abort();
    await this.#loop;
  }
}
