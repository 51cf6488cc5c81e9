/**
 * Keeps the identities this node holds free of Cilium's GC mark (`io.cilium.heartbeat`), which
 * Cilium's operator sets on an identity no `CiliumEndpoint` names and deletes a heartbeat timeout
 * later: an identity this node's reference object holds under its current epoch is unmarked as
 * soon as the informer shows the mark, and again at every lease renewal (a sweep of the index),
 * well within the operator's timeout (the options check that renewal comes within a third of it) —
 * while the node's claim is valid: a node whose lease lapsed holds nothing until it re-proves.
 *
 * A mark that idalloc's own GC set on an identity this node holds means GC did not see the
 * reference (the reference object was deleted by hand, or GC read it before a write that was lost
 * to it): the whole object is written again with the unmark (`refs.ts`).
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { isStatus } from "./kube.ts";
import type { IdentityRecord } from "./layout.ts";
import type { LeaseKeeper } from "./lease.ts";
import type { RefKeeper } from "./refs.ts";
import { unmarkPatch } from "./patch.ts";
import type { IdentityInformer } from "./watch.ts";

const log = idallocLogger("k8s");

/** See the module doc. */
export class MarkKeeper {
  readonly #ctx: K8sContext;
  readonly #lease: LeaseKeeper;
  readonly #refs: RefKeeper;
  readonly #informer: () => IdentityInformer;
  readonly #spawn: (task: Promise<unknown>) => void;
  readonly #signal: AbortSignal;
  readonly #inFlight = new Set<number>();
  /** When the reference object was last written again for a mark (`performance.now()`). */
  #reassertedAt = -Infinity;
  /** Marks removed since the session opened (for tests and status). */
  unmarked = 0;

  /**
   * @param ctx the backend's context
   * @param lease the node's lease (its epoch names what this node holds)
   * @param refs the node's reference object (what it holds)
   * @param informer the session's informer (a function: it is made after this keeper)
   * @param spawn tracks a background write, so that closing the session waits for it
   * @param signal the session's closing signal
   */
  constructor(
    ctx: K8sContext,
    lease: LeaseKeeper,
    refs: RefKeeper,
    informer: () => IdentityInformer,
    spawn: (task: Promise<unknown>) => void,
    signal: AbortSignal,
  ) {
    this.#ctx = ctx;
    this.#lease = lease;
    this.#refs = refs;
    this.#informer = informer;
    this.#spawn = spawn;
    this.#signal = signal;
  }

  /**
   * The informer saw `record`: unmark it if this node holds it and it is marked. Not while the
   * node's claim has lapsed: its references are dead for everyone then, GC may rightly collect
   * the identity, and the node re-proves its keys (which unmarks what it still holds) first.
   */
  check(record: IdentityRecord): void {
    if (record.mark === undefined || this.#lease.lost) return;
    if (Date.now() >= this.#lease.claimValidUntil) return;
    if (!this.#refs.holds(record.id, this.#lease.epoch)) return;
    if (this.#inFlight.has(record.id) || this.#signal.aborted) return;
    this.#inFlight.add(record.id);
    this.#spawn(this.#unmark(record).finally(() => this.#inFlight.delete(record.id)));
  }

  /** Unmarks every marked identity this node holds (at each renewal). */
  sweep(): void {
    for (const record of this.#informer().index.records()) this.check(record);
  }

  async #unmark(record: IdentityRecord): Promise<void> {
    const { client, identities } = this.#ctx;
    try {
      const written = await client.patch(identities, String(record.id), unmarkPatch(), {
        type: "merge",
        signal: this.#signal,
      });
      this.unmarked++;
      log.info("removed Cilium's GC mark ({mark}) from held identity {id}", {
        mark: record.mark,
        id: record.id,
      });
      this.#informer().observe(written);
      // Once per lease TTL at most: Cilium's operator marks every identity no endpoint names,
      // held or not, and one rewrite answers every mark of that round.
      if (performance.now() - this.#reassertedAt >= this.#lease.ttlMs) {
        this.#reassertedAt = performance.now();
        await this.#refs.reassert(this.#signal);
      }
    } catch (err) {
      if (this.#signal.aborted || isStatus(err, 404)) return;
      // The next sweep (at the next renewal) tries again.
      log.warning("removing the GC mark of held identity {id} failed: {err}", {
        id: record.id,
        err,
      });
    }
  }
}
