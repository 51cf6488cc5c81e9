/**
 * References kept where only their node writes: each idalloc node has one **reference object**, a
 * `Lease` `idalloc-refs-<node>` in the coordination namespace, whose annotation `idalloc.io/held`
 * lists the identities it holds, `<id>=<epoch>,…` in ID order. A reference is live while the node's
 * Lease (`idalloc-node-<node>`) is live and carries its epoch (`liveness.ts`), as before.
 *
 * **One annotation, not one per reference.** The API server tracks every annotation as a field of
 * the writer in `managedFields` and recomputes that set on each write: measured on kube-apiserver
 * v1.20 (a loaded machine, the server's own request time), a merge patch adding one reference to an
 * object of 10, 300, 1,000 and 3,000 per-ID annotations (`held.idalloc.io/<id>`, the layout before)
 * took 8.8, 21, 30 and 97 ms, and one rewriting the packed list 8.2, 7.2, 9.3 and 12.8 ms; the
 * object is 6× smaller. Every join is such a write. Objects written before carry per-ID
 * annotations: readers count both, and the node's first write drops the old ones.
 *
 * **Why here, not on the identity.** Before, each reference was an annotation
 * `ref.idalloc.io/<node>` on the shared `CiliumIdentity`: an identity every node uses grew by one
 * annotation per node (256 KiB cap: about 2,777 nodes), every join shipped the whole object to
 * every watcher (a rollout over N nodes: O(N²) bytes) and all joiners contended on one resource
 * version. Now a join writes the joiner's own object (O(1) bytes on the identity's watch: nothing,
 * unless the identity is marked), no two nodes write one object, and an identity's size does not
 * depend on how many nodes hold it. A `Lease` rather than a `ConfigMap`: it needs no RBAC rule
 * beyond the Leases idalloc already writes in that namespace, and nothing else mounts or caches
 * it. Its annotations bound one node's references: {@linkcode MAX_REFS_PER_NODE} whatever the IDs,
 * about 11,200 with Cilium's 5-digit IDs ({@linkcode ReferenceLimitError} past the exact measure).
 *
 * **The writer** ({@linkcode RefKeeper}): the node keeps what it wants stored (ID → epoch and the
 * keys it holds there) and what it last wrote, and when they differ writes the list as one JSON
 * merge patch;
 * concurrent changes made while a write is under way go out together in the next one (ensure after
 * a new epoch rewrites all references in one or two writes). Being the only writer, it needs no
 * resource-version guard; an object that vanished (GC removed it while the node's Lease had lapsed,
 * an operator deleted it) is created again with everything the node holds.
 *
 * **GC against a join (why each interleaving is safe).** A join no longer writes the identity, so
 * the identity's resource version alone no longer proves "nobody joined since". GC runs Cilium's
 * operator protocol: a pass lists the identities, **then** the reference objects, **then** the
 * node Leases; an identity unused by `users.ts`'s rule is marked (`io.cilium.heartbeat`, guarded
 * by its listed version); a later pass, at least the grace after the mark, that lists it still
 * marked and unused deletes it guarded by the version it listed. A joiner J of identity N writes
 * its reference first (W, committed at t_w), **then** looks at N in its informer: marked (or not
 * yet recording the coordination namespace) → it removes the mark with a patch that tests N still
 * carries the key (a new version), before answering; gone → the claim rule (`claim.ts`) re-creates
 * N or moves the key. Take the delete pass P of N (identities listed at t_i, references at t_r,
 * t_i < t_r, delete guarded by the version v listed at t_i):
 *
 * 1. **t_r after t_w**: P reads J's reference, live while J's Lease is → N is in use; no delete.
 * 2. **t_r before t_w, J's informer shows the mark** (set at least the grace before t_r): J's
 *    unmark lands before P's delete → N's version is no longer v, the delete is refused (409); or
 *    after it → J's unmark finds N gone (404) and J re-creates N from its claim before answering.
 * 3. **t_r before t_w, J's informer does not show the mark** (its watch trails by more than the
 *    grace: 30 min by default; a watch silent for 2 minutes is restarted): the delete may win. J
 *    answered N; its informer then shows N deleted, and the allocator's master-key protection
 *    re-creates N from the claim through `ensure` (as for any deleted identity a node holds): the
 *    claim names N → touched and N created again; the claim was dropped with N → created anew
 *    naming N, unless a racing node claimed the key first (409), whose identity J then moves to
 *    (`reassigned`); N taken by another key meanwhile → moved likewise. Never two identities of
 *    a key among idalloc nodes: every create still follows the creator's own guarded claim write.
 * 4. **A mark after t_w**: a pass that marks N listed it before its reference read; if that read
 *    came after t_w it saw J and marked nothing; if before, its mark is followed by a delete pass
 *    whose reference read is later than the mark plus the grace, so after t_w: case 1.
 * 5. **A new identity**: the creator writes its reference before the create (in parallel with its
 *    claim write), so the identity is referenced from the instant it exists, as when the creator's
 *    annotation was part of the create.
 *
 * J also removes a mark it finds later on an identity it holds (`heartbeat.ts`, at once from the
 * watch and at every renewal), and then writes its whole reference object again: a mark on a held
 * identity means GC did not see the reference (an operator deleted the object).
 *
 * **Migration.** Identities written by the older layout keep their `ref.idalloc.io/<node>`
 * annotations; every reader (GC, the doctor, `refs`, `release --node`, the allocator's
 * `users.ts` rule) counts them beside the reference objects, by the same Leases, so a store keeps
 * every reference while nodes of both versions run. Upgraded nodes never write annotations; GC's
 * sweep removes the old ones once dead (`sweep.ts`).
 *
 * @example The references of the objects as judges read them (ID → node → epoch)
 * ```ts
 * import assert from "node:assert/strict";
 * import { nodeRefsObject, readNodeRefs } from "./layout.ts";
 * import { referencesById } from "./refs.ts";
 *
 * const a = readNodeRefs(nodeRefsObject("a", new Map([[300, "e1"], [301, "e1"]])))!;
 * const b = readNodeRefs(nodeRefsObject("b", new Map([[300, "e7"]])))!;
 * const byId = referencesById([a, b]);
 * assert.deepEqual([...byId.get(300)!], [["a", "e1"], ["b", "e7"]]);
 * ```
 *
 * @module
 */
import { abortable } from "../../abort.ts";
import { IdallocError, type IdallocErrorOptions } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { countedClient, isStatus, type Tally } from "./kube.ts";
import {
  HELD_ANNOTATION,
  nodeRefsObject,
  type NodeRefsRecord,
  packHeld,
  readNodeRefs,
  REFS_SELECTOR,
  refsName,
} from "./layout.ts";
import { MAX_REFS_PER_NODE, REFS_MAX_BYTES, refsBytes } from "./limits.ts";
import { LEASES } from "./options.ts";
import { listAll } from "./paging.ts";

const log = idallocLogger("k8s", "refs");

/**
 * A node's reference object cannot take another reference: its annotations would pass the API
 * server's 256 KiB limit. Not retryable while the node holds what it holds: release keys first.
 */
export class ReferenceLimitError extends IdallocError {
  /** The node. */
  readonly node: string;
  /** How many identities it references. */
  readonly count: number;

  /**
   * Creates the error.
   *
   * @param node the node
   * @param count how many identities it references
   * @param options the `cause`
   */
  constructor(node: string, count: number, options?: IdallocErrorOptions) {
    super(
      `node ${node} references ${count} identities, as many as its reference object holds ` +
        `(256 KiB of annotations: at least ${MAX_REFS_PER_NODE}); release keys before acquiring more`,
      options,
    );
    this.name = "ReferenceLimitError";
    this.node = node;
    this.count = count;
  }
}

/** What the node wants stored for one ID: the epoch, and the keys it holds there. */
interface Wanted {
  epoch: string;
  readonly keys: Set<string>;
}

/** The node's writer of its reference object (see the module doc). */
export class RefKeeper {
  readonly #ctx: K8sContext;
  readonly #signal: AbortSignal;
  readonly #wanted = new Map<number, Wanted>();
  /** What the object holds after this keeper's last write (or read), ID → epoch. */
  #written = new Map<number, string>();
  /** Whether the object exists (as far as this keeper knows). */
  #exists = false;
  /** Annotations of the earlier layout the object carries (`held.idalloc.io/…`): the next write drops them. */
  #legacy: readonly string[] = [];
  /** The write queue: one write at a time, each carrying every change made before it started. */
  #chain: Promise<void> = Promise.resolve();
  /** Writes of the object that reached the API server (for tests and figures). */
  writes = 0;

  /**
   * @param ctx the backend's context
   * @param signal the session's closing signal (writes are the session's, not one caller's)
   */
  constructor(ctx: K8sContext, signal: AbortSignal) {
    this.#ctx = ctx;
    this.#signal = signal;
  }

  /**
   * Reads the object at open: what an earlier session of this node left is removed at once (its
   * epochs are dead, and it would only grow the object).
   */
  async start(signal: AbortSignal): Promise<void> {
    const { client, namespace, node } = this.#ctx;
    const obj = await client.get(LEASES, refsName(node), { namespace, signal });
    const read = obj === undefined ? undefined : readNodeRefs(obj);
    this.#exists = obj !== undefined;
    this.#written = new Map(read?.refs ?? []);
    this.#legacy = read?.legacy ?? [];
    if (this.#written.size > 0 || this.#legacy.length > 0) await this.flush(signal);
  }

  /** Whether the object holds a reference to `id` under `epoch` (written, not only wanted). */
  holds(id: number, epoch: string): boolean {
    return epoch !== "" && this.#wanted.get(id)?.epoch === epoch && this.#written.get(id) === epoch;
  }

  /** Whether this node wants a reference to `id` for some key. */
  wants(id: number): boolean {
    return this.#wanted.has(id);
  }

  /** The keys this node holds on `id`. */
  keysOf(id: number): ReadonlySet<string> {
    return this.#wanted.get(id)?.keys ?? new Set();
  }

  /** The IDs this node references. */
  ids(): number[] {
    return [...this.#wanted.keys()];
  }

  /**
   * Wants a reference to `id` for `key` under `epoch`, without writing yet. Throws
   * {@linkcode ReferenceLimitError} when the object could not hold it (nothing changed then).
   */
  stage(id: number, key: string, epoch: string): void {
    const wanted = this.#wanted.get(id);
    if (wanted === undefined) {
      const bytes = refsBytes([...this.#wantedEpochs(), [id, epoch]]);
      if (bytes > REFS_MAX_BYTES) throw new ReferenceLimitError(this.#ctx.node, this.#wanted.size);
      this.#wanted.set(id, { epoch, keys: new Set([key]) });
      return;
    }
    wanted.epoch = epoch;
    wanted.keys.add(key);
  }

  /** {@linkcode stage}, then {@linkcode flush}: resolves once the reference is stored. */
  async hold(
    id: number,
    key: string,
    epoch: string,
    signal: AbortSignal,
    tally?: Tally,
  ): Promise<void> {
    this.stage(id, key, epoch);
    await this.flush(signal, tally);
  }

  /**
   * Gives up `key`'s references to `ids`: an ID no other key of this node is held on leaves the
   * object (at the next write).
   */
  unstage(key: string, ids: Iterable<number>): void {
    for (const id of ids) {
      const wanted = this.#wanted.get(id);
      if (wanted === undefined) continue;
      wanted.keys.delete(key);
      if (wanted.keys.size === 0) this.#wanted.delete(id);
    }
  }

  /** {@linkcode unstage}, then {@linkcode flush}. */
  async drop(
    key: string,
    ids: Iterable<number>,
    signal: AbortSignal,
    tally?: Tally,
  ): Promise<void> {
    this.unstage(key, ids);
    await this.flush(signal, tally);
  }

  /** Drops every reference to `id`, whatever keys this node held there. */
  forget(id: number): void {
    this.#wanted.delete(id);
  }

  /**
   * Writes what differs from what the object holds; resolves once every change made before the
   * call is stored (a write under way when it is called is followed by one more). `signal` bounds
   * the caller's wait only: the write itself runs until the session closes. `tally` counts the
   * requests of the write this call queued (none when an earlier one carried its change).
   */
  flush(signal: AbortSignal, tally?: Tally): Promise<void> {
    const run = this.#chain.then(async () => {
      const requests = await this.#write();
      if (tally !== undefined) tally.count += requests;
    });
    this.#chain = run.catch(() => {});
    return abortable(run, signal);
  }

  /**
   * Writes every reference again, as if the object were lost (a held identity was found marked:
   * GC did not see this node's reference).
   */
  reassert(signal: AbortSignal): Promise<void> {
    this.#written = new Map();
    return this.flush(signal);
  }

  /**
   * Deletes the object when this node references nothing (closing: the name is free and GC has
   * nothing to judge). Best effort.
   */
  async removeIfEmpty(signal: AbortSignal): Promise<void> {
    if (this.#wanted.size > 0 || !this.#exists) return;
    const { client, namespace, node } = this.#ctx;
    try {
      await client.delete(LEASES, refsName(node), { namespace, signal });
    } catch (err) {
      log.debug("deleting the reference object of {node} failed: {err}", { node, err });
    }
  }

  *#wantedEpochs(): Iterable<[number, string]> {
    for (const [id, w] of this.#wanted) yield [id, w.epoch];
  }

  /** One write of the difference (see the module doc); returns the requests it made. */
  async #write(): Promise<number> {
    const { client, namespace, node } = this.#ctx;
    const signal = this.#signal;
    const wanted = new Map(this.#wantedEpochs());
    const same = wanted.size === this.#written.size &&
      [...wanted].every(([id, epoch]) => this.#written.get(id) === epoch);
    if (same && this.#legacy.length === 0 && (this.#exists || wanted.size === 0)) return 0;
    let requests = 0;
    if (this.#exists) {
      requests++;
      const annotations: Record<string, string | null> = {
        [HELD_ANNOTATION]: wanted.size > 0 ? packHeld(wanted) : null,
      };
      for (const legacy of this.#legacy) annotations[legacy] = null;
      try {
        await client.patch(LEASES, refsName(node), { metadata: { annotations } }, {
          type: "merge",
          namespace,
          signal,
        });
        this.writes++;
        this.#written = wanted;
        this.#legacy = [];
        return requests;
      } catch (err) {
        if (!isStatus(err, 404)) throw err;
        log.info("the reference object of {node} was removed: writing it again", { node });
      }
    }
    try {
      requests++;
      await client.create(LEASES, nodeRefsObject(node, wanted), { namespace, signal });
      this.writes++;
      this.#exists = true;
      this.#written = wanted;
      return requests;
    } catch (err) {
      if (!isStatus(err, 409)) throw err;
      // Created meanwhile (by an earlier session of this node whose write was still under way):
      // its content is unknown, so the next write sets every reference.
      this.#exists = true;
      this.#written = new Map();
      return requests + await this.#write();
    }
  }
}

/** Every node's reference object in the namespace (one paged list), by node. */
export async function readReferenceObjects(
  ctx: Pick<K8sContext, "client" | "namespace">,
  signal: AbortSignal,
  tally?: Tally,
): Promise<Map<string, NodeRefsRecord>> {
  const { items } = await listAll(countedClient(ctx.client, tally), LEASES, {
    namespace: ctx.namespace,
    labelSelector: REFS_SELECTOR,
    signal,
  });
  return referenceObjects(items.flatMap((obj) => readNodeRefs(obj) ?? []));
}

/**
 * The objects that speak for their node, by node: an object whose name is not its holder's own
 * (copied or hand-made) never does.
 */
export function referenceObjects(records: Iterable<NodeRefsRecord>): Map<string, NodeRefsRecord> {
  const out = new Map<string, NodeRefsRecord>();
  for (const r of records) if (r.name === refsName(r.node)) out.set(r.node, r);
  return out;
}

/** The references of `objects` by identity: ID → node → epoch. */
export function referencesById(
  objects: Iterable<NodeRefsRecord>,
): Map<number, Map<string, string>> {
  const out = new Map<number, Map<string, string>>();
  for (const o of objects) {
    for (const [id, epoch] of o.refs) {
      let nodes = out.get(id);
      if (nodes === undefined) out.set(id, nodes = new Map());
      nodes.set(o.node, epoch);
    }
  }
  return out;
}

/**
 * Each node among `refs` (node → epoch pairs, a node possibly twice: once per layout) and whether
 * it references live: a node is live when any of its references is, by `live`.
 */
export function referencingNodes(
  refs: Iterable<readonly [node: string, epoch: string]>,
  live: (node: string, epoch: string) => boolean,
): Map<string, boolean> {
  const out = new Map<string, boolean>();
  for (const [node, epoch] of refs) out.set(node, out.get(node) === true || live(node, epoch));
  return out;
}

/**
 * Every reference to identity `record` a judge counts: the annotations of the older layout on it
 * and the nodes' reference objects naming it (node → epoch; a node in both counts once, live if
 * either epoch is).
 */
export function referencesOf(
  record: { readonly id: number; readonly refs: ReadonlyMap<string, string> },
  byId: ReadonlyMap<number, ReadonlyMap<string, string>>,
): [node: string, epoch: string][] {
  return [...record.refs, ...byId.get(record.id) ?? []];
}
