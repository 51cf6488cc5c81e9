/**
 * Write-behind releases (the allocator's `releaseInBackground` option): a key's last local release
 * returns once the node's own bookkeeping is done, and the deletion of the node's reference goes
 * to the store behind it. Deletions that pile up while earlier ones are in flight are handed to the
 * session together, where they share group-commit requests.
 *
 * What it guarantees:
 * - a deletion not handed to the store yet is cancelled when the key is acquired again on this
 *   node, so the reference the acquisition finds is never deleted under it (Cilium's
 *   `TestAllocateReleaseRace` shape: release and re-allocate back to back);
 * - a deletion already handed over is waited for before the key is acquired again, so the two
 *   never race in the store;
 * - `flush()` returns once every deletion scheduled before it has landed or failed; a failed one
 *   is left to the sync, which keeps deleting it (as with a synchronous release that fails).
 *
 * Until a deletion lands, the reference keeps the ID alive in the store: GC cannot collect it yet,
 * which is the safe side. A node that dies first leaves the reference to lapse with its lease.
 *
 * @example A release returns before its deletion lands; flush waits for it
 * ```ts
 * import assert from "node:assert/strict";
 * import { ReleasesBehind } from "./release_behind.ts";
 *
 * const deleted: string[] = [];
 * const behind = new ReleasesBehind({
 *   release: async (key) => {
 *     await new Promise((r) => setTimeout(r, 5));
 *     deleted.push(key);
 *   },
 *   failed: () => {},
 * });
 * behind.schedule("a", 1);
 * behind.schedule("b", 2); // queued behind "a"
 * await behind.settle("b"); // re-acquiring "b": its deletion is cancelled
 * await behind.flush();
 * assert.deepEqual(deleted, ["a"]);
 * ```
 *
 * @module
 */

/** What write-behind releases need of their owner. */
export interface ReleasesBehindParts {
  /** Deletes the node's reference to `key` (the session's `release`). */
  release(key: string, id: number): Promise<void>;
  /** A deletion failed: the owner's sync takes it over. */
  failed(key: string, id: number, err: unknown): void;
}

/** Deletions of released references, queued and in flight (see the module documentation). */
export class ReleasesBehind {
  readonly #parts: ReleasesBehindParts;
  /** Released keys whose deletion has not been handed to the store yet. */
  readonly #queued = new Map<string, number>();
  /** Deletions handed to the store, by key. */
  readonly #inFlight = new Map<string, Promise<void>>();

  /** @param parts the session's deletion and the owner's fallback for failures */
  constructor(parts: ReleasesBehindParts) {
    this.#parts = parts;
  }

  /** Deletions scheduled and not landed yet. */
  get pending(): number {
    return this.#queued.size + this.#inFlight.size;
  }

  /** Schedules the deletion of the node's reference to `key` (ID `id`). */
  schedule(key: string, id: number): void {
    this.#queued.set(key, id);
    // Nothing of ours in flight: go now (an idle node pays no latency). Otherwise the queue goes
    // out when the deletions in flight have landed, all together.
    if (this.#inFlight.size === 0) this.#send();
  }

  /**
   * `key` is about to be acquired again: cancels its deletion if it is still queued, else waits
   * until the deletion in flight has landed or failed.
   */
  async settle(key: string): Promise<void> {
    if (this.#queued.delete(key)) return;
    await this.#inFlight.get(key);
  }

  /** Waits until every deletion scheduled so far has landed or failed. */
  async flush(): Promise<void> {
    while (this.pending > 0) {
      if (this.#inFlight.size === 0) this.#send();
      await Promise.all([...this.#inFlight.values()]);
    }
  }

  #send(): void {
    const batch = [...this.#queued];
    this.#queued.clear();
    for (const [key, id] of batch) {
      const done = this.#parts.release(key, id).then(
        () => {},
        (err) => this.#parts.failed(key, id, err),
      ).finally(() => {
        this.#inFlight.delete(key);
        if (this.#inFlight.size === 0 && this.#queued.size > 0) this.#send();
      });
      this.#inFlight.set(key, done);
    }
  }
}
