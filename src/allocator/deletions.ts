/**
 * Reference deletions: the one owner of "this node's reference to a key must go", whatever made
 * it so and wherever it stands.
 *
 * Why a reference must go ({@linkcode Deletion}):
 * - `released`: the key's last local release (the reference to a known ID);
 * - `abandoned`: an acquisition was aborted after its write was sent, so a reference may have
 *   landed under an ID nobody learned; nothing must keep that ID alive for a key nobody holds.
 *
 * Where a deletion stands: **queued** (write-behind, `releaseInBackground`: deletions that pile up
 * while a batch is in flight go out together, where they share group-commit requests), **in
 * flight** (handed to the session) or **failed** (kept until {@linkcode ReferenceDeletions.retry},
 * which the sync calls, sends it again). A deletion that lands is forgotten.
 *
 * What it guarantees:
 * - a key this node holds is never deleted: a key acquired again cancels its queued or failed
 *   deletion and waits for one in flight first ({@linkcode ReferenceDeletions.settle}; Cilium's
 *   `TestAllocateReleaseRace` shape: release and re-allocate back to back), and a queued deletion
 *   of a key held when its batch goes out is dropped;
 * - {@linkcode ReferenceDeletions.flush} returns once every deletion queued or in flight when it
 *   was called has landed or failed (a failed one is left to the sync, as a synchronous release
 *   that fails is); it never waits for deletions queued later than the next batch.
 *
 * Until a deletion lands, the reference keeps the ID alive in the store: GC cannot collect it yet,
 * which is the safe side. A node that dies first leaves the reference to lapse with its lease.
 *
 * @example A queued deletion is cancelled by a re-acquisition; flush waits for the rest
 * ```ts
 * import assert from "node:assert/strict";
 * import { ReferenceDeletions } from "./deletions.ts";
 *
 * const deleted: string[] = [];
 * const deletions = new ReferenceDeletions({
 *   session: {
 *     release: async (key) => {
 *       await new Promise((r) => setTimeout(r, 5));
 *       deleted.push(key);
 *     },
 *   },
 *   local: { get: () => undefined },
 *   signal: new AbortController().signal,
 * });
 * deletions.schedule("a", 1); // goes out at once
 * deletions.schedule("b", 2); // queued behind "a"
 * assert.equal(deletions.state("b"), "queued");
 * await deletions.settle("b"); // "b" is acquired again: its deletion is cancelled
 * await deletions.flush();
 * assert.deepEqual(deleted, ["a"]);
 * ```
 *
 * @module
 */
import type { BackendSession } from "./backend.ts";
import type { LocalKeys } from "./local_keys.ts";
import { idallocLogger } from "../log.ts";

const log = idallocLogger("allocator");

/** How long {@linkcode ReferenceDeletions.close} waits for deletions to land, by default. */
export const CLOSE_FLUSH_MS = 5_000;

/**
 * The ID the session is told for an abandoned deletion: `BackendSession.release` deletes the
 * node's reference whatever ID it holds, and documents 0 for this case. Used at that call only.
 */
const UNKNOWN_ID = 0;

/** Why this node's reference to a key must go. */
export type Deletion =
  /** The key's last local release: the reference to `id`. */
  | { readonly kind: "released"; readonly id: number }
  /** An aborted acquisition may have written a reference, under an ID it never learned. */
  | { readonly kind: "abandoned" };

/** Where a key's deletion stands (see the module doc). */
export type DeletionState = "queued" | "in flight" | "failed";

/** What {@linkcode ReferenceDeletions} works with. */
export interface DeletionParts {
  readonly session: Pick<BackendSession, "release">;
  /** The node's held keys: a held key's reference is never deleted. */
  readonly local: Pick<LocalKeys, "get">;
  /** Bounds every background deletion (the allocator's closing signal). */
  readonly signal: AbortSignal;
}

/** The deletions of this node's references (see the module doc). */
export class ReferenceDeletions {
  readonly #p: DeletionParts;
  /** Deletions not handed to the session yet, by key. */
  readonly #queued = new Map<string, Deletion>();
  /** Deletions handed to the session, by key; each resolves to whether it landed (never rejects). */
  readonly #inFlight = new Map<string, Promise<boolean>>();
  /** Deletions that failed, by key, until the next retry. */
  readonly #failed = new Map<string, Deletion>();
  /** The batch sent from the queue, until every deletion in it has landed or failed. */
  #sending: Promise<void> | undefined;
  /** Resolved once the deletions now queued have landed, failed or been cancelled. */
  #queueDone: PromiseWithResolvers<void> | undefined;

  /** Deletions over `parts`. */
  constructor(parts: DeletionParts) {
    this.#p = parts;
  }

  /** Deletions queued or in flight. */
  get pending(): number {
    return this.#queued.size + this.#inFlight.size;
  }

  /** Deletions that failed and wait for the next retry. */
  get failed(): number {
    return this.#failed.size;
  }

  /** Where the deletion of `key`'s reference stands; `undefined` when there is none. */
  state(key: string): DeletionState | undefined {
    if (this.#queued.has(key)) return "queued";
    if (this.#inFlight.has(key)) return "in flight";
    return this.#failed.has(key) ? "failed" : undefined;
  }

  /** Write-behind: queues the deletion of the node's reference to `key` (ID `id`). */
  schedule(key: string, id: number): void {
    this.#enqueue(key, { kind: "released", id });
  }

  /**
   * An acquisition of `key` was aborted after its write was sent: queues the deletion of whatever
   * reference it left, unless the key is held when the deletion goes out.
   */
  abandoned(key: string): void {
    this.#enqueue(key, { kind: "abandoned" });
  }

  /**
   * Deletes the node's reference to `key` (ID `id`) now, bounded by `signal`. Resolves to whether
   * it landed; one that failed is kept for the next {@linkcode ReferenceDeletions.retry}.
   */
  deleteNow(key: string, id: number, signal: AbortSignal): Promise<boolean> {
    this.#cancel(key);
    return this.#send(key, { kind: "released", id }, signal);
  }

  /**
   * `key` is about to be acquired again (the caller holds its lock): cancels its queued or failed
   * deletion, and waits until one in flight has landed or failed.
   */
  async settle(key: string): Promise<void> {
    for (;;) {
      this.#cancel(key);
      const inFlight = this.#inFlight.get(key);
      if (!inFlight) return;
      await inFlight;
    }
  }

  /**
   * Resolves once every deletion queued or in flight now has landed or failed (or was cancelled).
   */
  async flush(): Promise<void> {
    const waits: Promise<unknown>[] = [...this.#inFlight.values()];
    if (this.#queued.size > 0) waits.push((this.#queueDone ??= Promise.withResolvers()).promise);
    await Promise.all(waits);
  }

  /**
   * Sends every failed deletion again (the sync calls this) and waits like
   * {@linkcode ReferenceDeletions.flush}; one that fails again stays failed. Never rejects.
   */
  async retry(): Promise<void> {
    const failed = [...this.#failed];
    this.#failed.clear();
    for (const [key, deletion] of failed) {
      if (!this.#queued.has(key)) this.#enqueue(key, deletion);
    }
    await this.flush();
  }

  /**
   * Lets deletions land before the owner closes: {@linkcode ReferenceDeletions.flush}, waited for
   * at most `boundMs`. Never rejects; what is still in flight then is stopped by `signal`.
   */
  async close(boundMs: number = CLOSE_FLUSH_MS): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const bound = new Promise<void>((resolve) => (timer = setTimeout(resolve, boundMs)));
    try {
      await Promise.race([this.flush(), bound]);
    } finally {
      clearTimeout(timer);
    }
  }

  #enqueue(key: string, deletion: Deletion): void {
    this.#failed.delete(key);
    this.#queued.set(key, deletion);
    // No batch in flight: go now (an idle node pays no latency). Otherwise the queue goes out
    // when the batch in flight has landed, all together.
    if (!this.#sending) this.#sendQueue();
  }

  /** Drops `key`'s queued or failed deletion. */
  #cancel(key: string): void {
    this.#failed.delete(key);
    if (this.#queued.delete(key) && this.#queued.size === 0) this.#queueSettled();
  }

  #queueSettled(): void {
    this.#queueDone?.resolve();
    this.#queueDone = undefined;
  }

  #sendQueue(): void {
    const done = this.#queueDone;
    this.#queueDone = undefined;
    const batch: Promise<boolean>[] = [];
    for (const [key, deletion] of this.#queued) {
      // Held again without a settle: an abandoned acquisition of a key a re-check holds.
      if (this.#p.local.get(key)) continue;
      batch.push(this.#send(key, deletion, this.#p.signal));
    }
    this.#queued.clear();
    this.#sending = Promise.all(batch).then(() => {
      this.#sending = undefined;
      done?.resolve();
      if (this.#queued.size > 0) this.#sendQueue();
    });
  }

  #send(key: string, deletion: Deletion, signal: AbortSignal): Promise<boolean> {
    const id = deletion.kind === "released" ? deletion.id : UNKNOWN_ID;
    const sent: Promise<boolean> = this.#p.session.release(key, id, signal).then(
      () => true,
      (err) => {
        // A deletion queued meanwhile supersedes this one.
        if (!this.#queued.has(key)) this.#failed.set(key, deletion);
        log.warning("could not delete reference of {key}; will retry: {err}", { key, err });
        return false;
      },
    ).finally(() => {
      if (this.#inFlight.get(key) === sent) this.#inFlight.delete(key);
    });
    this.#inFlight.set(key, sent);
    return sent;
  }
}
