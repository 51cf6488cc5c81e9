/**
 * Whether the informer's index is provably current: what lets `acquire` create an identity on the
 * index's word that the key has none. Cilium's agents create identities without a lock or a claim,
 * so the index is the only thing that tells an idalloc node that an agent already gave a key its
 * identity; a node whose watch lags would create a second one beside it (the mixed nemesis, seed 4:
 * 44 s after Cilium's identity was stored, the watch failing since a forced-expiry fault).
 *
 * The index is **proven** current when a list of the identities has been applied, or when the
 * watch delivered an event or a bookmark. It is **lost** when the watch breaks: `410 Gone`
 * (until the re-list is applied) or any failure of a list or watch (until the next list or event;
 * a watch resumed from its last version delivers what it missed first). A proof older than
 * {@linkcode CURRENT_VIEW_MS} no longer counts: a stream that stopped delivering without breaking
 * (a stalled server, a dead connection not yet noticed) looks like a quiet one until then.
 *
 * Where the index is not current, `acquire` reads the key's identities from the store (a
 * consistent list, one request) before it creates one (`master.ts`, `identitiesOfKey`). So a quiet
 * watch costs that request per new key once its proof is older than the bound: API servers that
 * send a bookmark every minute keep a quiet watch proven; kube-apiserver v1.20.2 (the tests')
 * sent none in 140 s on a quiet watch (measured; it sends one 2 s before the watch's own timeout),
 * so there a new key after 75 s without any identity change costs 4 requests instead of 3.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { CURRENT_VIEW_MS, ViewFreshness } from "./view_freshness.ts";
 *
 * let now = 0;
 * const view = new ViewFreshness(CURRENT_VIEW_MS, () => now);
 * assert.equal(view.current, false, "nothing listed yet");
 * view.proven();
 * assert.equal(view.current, true);
 * view.lost();
 * assert.equal(view.current, false, "the watch broke");
 * view.proven();
 * now += CURRENT_VIEW_MS + 1;
 * assert.equal(view.current, false, "silent for too long");
 * ```
 *
 * @module
 */

/**
 * How long a proof of the index's currency lasts, in ms: the bookmark period of API servers that
 * send periodic bookmarks (one minute) plus a quarter of it for a loaded server, as Kubernetes' own
 * watch cache keeps events for its bookmark period plus 15 s. A stream that stalls without breaking
 * is distrusted after this long, not only at the informer's idle timeout (2 minutes).
 */
export const CURRENT_VIEW_MS = 75_000;

/** See the module doc. */
export class ViewFreshness {
  readonly #boundMs: number;
  readonly #now: () => number;
  /** When the index was last proven current (monotonic ms); `undefined` while it is not. */
  #provenAt: number | undefined;

  /**
   * @param boundMs how long a proof lasts
   * @param now the monotonic clock (tests set it)
   */
  constructor(boundMs: number = CURRENT_VIEW_MS, now: () => number = () => performance.now()) {
    this.#boundMs = boundMs;
    this.#now = now;
  }

  /** A list was applied, or the watch delivered an event or a bookmark. */
  proven(): void {
    this.#provenAt = this.#now();
  }

  /** The watch broke (`410 Gone`, a failed list or watch): not current until the next proof. */
  lost(): void {
    this.#provenAt = undefined;
  }

  /** Whether the index is current now (proven, not lost since, and not too long ago). */
  get current(): boolean {
    return this.#provenAt !== undefined && this.#now() - this.#provenAt <= this.#boundMs;
  }
}
