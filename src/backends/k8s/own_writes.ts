/**
 * The informer's order without ordering resource versions. The API calls them opaque: two may be
 * compared for equality, never for order. The order comes from the watch instead: it delivers the
 * changes of the identities in the order they happened, so its events are applied as they come.
 *
 * The one other source is this session's own writes: their answers enter the index at once
 * (`IdentityInformer.observe`), ahead of the watch. While the index holds such a version that the
 * watch has not delivered yet, the watch's events of that identity are older than it (they come
 * before it in the stream) and are skipped; the delivery of that very version ends the wait. An
 * answer of a version the watch already delivered (a slow answer, overtaken by the watch) is
 * stale: the index may hold a later one, so it is not applied.
 *
 * A watch resumed after a break continues from the last position it reported, so it still
 * delivers what the session wrote. Only a re-list (`410 Gone`) skips ahead: writes answered
 * before the list was sent are in it (a consistent list reflects every write that completed
 * before it); those answered while it was under way cannot be placed, and the informer reads
 * them again ({@linkcode OwnWrites.listed}). As a last resort, a version the watch has not
 * delivered within `expireMs` no longer holds the watch back.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { OwnWrites } from "./own_writes.ts";
 *
 * const own = new OwnWrites();
 * assert.equal(own.wrote(7, "12", "10"), true); // this session's patch, answered at "12"
 * assert.equal(own.delivered(7, "11"), false); // the watch's older event: skipped
 * assert.equal(own.delivered(7, "12"), true); // the echo of the write: in step again
 * assert.equal(own.delivered(7, "13"), true);
 * assert.equal(own.wrote(7, "12", "13"), false); // a late answer the watch overtook
 * ```
 *
 * @module
 */

/** How many delivered versions are remembered (to tell a late answer by). */
const REMEMBERED = 10_000;

/** One write of this session that the watch has not delivered yet. */
interface Ahead {
  readonly rv: string;
  /** When it was answered (monotonic ms). */
  readonly at: number;
  /** The order of the answer among this session's writes. */
  readonly seq: number;
}

/** See the module doc. */
export class OwnWrites {
  readonly #ahead = new Map<number, Ahead>();
  /** Versions the watch or a list delivered, `id rv`, oldest first. */
  readonly #delivered = new Set<string>();
  readonly #now: () => number;
  readonly #expireMs: number;
  #seq = 0;

  /**
   * @param expireMs how long a write the watch does not deliver holds its events back
   * @param now the monotonic clock (tests set it)
   */
  constructor(expireMs = 120_000, now: () => number = () => performance.now()) {
    this.#expireMs = expireMs;
    this.#now = now;
  }

  /**
   * This session wrote identity `id`, answered at version `rv`; `indexRv` is the index's version
   * of it. Whether to apply the answer to the index: not when the index holds that version
   * already, nor when the watch delivered it already (a later version may be in the index).
   */
  wrote(id: number, rv: string, indexRv: string | undefined): boolean {
    if (rv === indexRv || this.#delivered.has(`${id} ${rv}`)) return false;
    this.#ahead.set(id, { rv, at: this.#now(), seq: ++this.#seq });
    return true;
  }

  /**
   * The watch (or a list) delivered version `rv` of identity `id` (`undefined`: no version).
   * Whether to apply it: not while the index holds a write of this session that comes later.
   */
  delivered(id: number, rv: string | undefined): boolean {
    if (rv !== undefined) this.#remember(`${id} ${rv}`);
    const own = this.#ahead.get(id);
    if (own === undefined) return true;
    if (rv !== own.rv && this.#now() - own.at <= this.#expireMs) return false;
    this.#ahead.delete(id);
    return true;
  }

  /** A consistent list is about to be sent: the mark to pass to {@linkcode OwnWrites.listed}. */
  listing(): number {
    return this.#seq;
  }

  /**
   * The list sent at `mark` arrived. Writes answered before it are in it: forgotten, the list
   * decides. Returns the IDs of those answered while it was under way, which the list may or may
   * not reflect: the index keeps them until they are read again (and then
   * {@linkcode OwnWrites.settled}).
   */
  listed(mark: number): number[] {
    const during: number[] = [];
    for (const [id, own] of this.#ahead) {
      if (own.seq <= mark) this.#ahead.delete(id);
      else during.push(id);
    }
    return during;
  }

  /** Identity `id` was read again after the write: the read decides. */
  settled(id: number): void {
    this.#ahead.delete(id);
  }

  /** Whether the index holds a write of identity `id` the watch has not delivered yet. */
  holds(id: number): boolean {
    return this.#ahead.has(id);
  }

  #remember(entry: string): void {
    this.#delivered.delete(entry);
    this.#delivered.add(entry);
    if (this.#delivered.size > REMEMBERED) {
      this.#delivered.delete(this.#delivered.values().next().value!);
    }
  }
}
