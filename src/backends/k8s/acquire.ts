/**
 * `acquire` on Kubernetes: reference the key's identity, or create one through the key's claim.
 *
 * - **Known key** (the informer's index holds an identity of it): Cilium's answer (the oldest) is
 *   joined by writing this node's reference to its own reference object (`refs.ts`), then looking
 *   at the identity in the index: marked by GC (or not recording the coordination namespace) → one
 *   JSON patch that `test`s it still carries the key and removes the mark (Cilium's
 *   `AcquireReference`) before answering; gone or relabelled → read it and follow the claim. 1
 *   round trip, on the node's own object: the identity is not written, so a join costs its
 *   watchers nothing (`refs.ts` has why GC stays safe against it).
 * - **New key**: create the claim Lease `idalloc-key-<hash>` naming a candidate ID and, in
 *   parallel, write this node's reference to it; then create the identity under that ID (the
 *   create by name is the atomic allocation, as in Cilium). 2 round trips.
 * - **Claim taken** (409): another idalloc node claimed the key; read the claim and follow it: join
 *   the identity it names, or, when it is missing, touch the claim under the version read and
 *   create that identity (a racing node's create then gets 409 and joins). A claim whose ID
 *   belongs to another key (or lies outside the range), or that names no key or ID (hand-made),
 *   is stale: it is moved to a new candidate by a merge patch guarded by its resource version (a
 *   lost race re-reads and follows the winner).
 * - **Identity taken** (409 on create): read it; the key's own → join, another key's → move the
 *   claim to the next candidate. One whose labels do not decode but that carries idalloc
 *   references, while the key's claim names it, is the key's own, damaged: repaired (its labels
 *   written again under its resource version, this node's reference added), never replaced.
 *
 * Both creates (a new key's, and one re-created from a claim) go through `createMaster`
 * (`master.ts`), the one identity-create step.
 *
 * **Cilium's answer, after the write.** Cilium's agents create identities without a lock: an older
 * identity of the key may reach the informer while this call writes. After every successful
 * write the index's answer is checked again; an older identity there is joined instead, and this
 * node's reference to the one it left is dropped (GC then collects that one, if unused), so the
 * call answers what Cilium's own lookup answers. Later arrivals are the core's to catch (a second
 * master of a held key).
 *
 * **Looking before creating, when the index may lag.** The index is the only thing that tells this
 * node that an agent gave the key an identity. Where it is not provably current (the watch broke or
 * went silent: `view_freshness.ts`), a create is preceded by a consistent list of the key's
 * identities, and one found is joined instead. An index proven current costs nothing more: a new
 * key stays 3 requests in 2 round trips.
 *
 * An identity is created only right after this node's own guarded write of the claim (create,
 * move or touch), and a create that came more than half a lease TTL after the call started is
 * confirmed by another touch of the claim, or removed again (`claim.ts` has the argument: no
 * idalloc node ever gives a key a second identity itself).
 *
 * **A create whose answer was lost** (the connection broke, the request timed out): the next
 * attempt of the allocation (`AttemptTrail.unconfirmed`) reads the identity and the key's claim
 * first. The identity is this call's creation when it carries the key and names this node and
 * the epoch the create wrote as its creator (`idalloc.io/creator`), and the claim is still at the
 * resource version this node's own write gave it just before the create (compared for equality
 * only): every idalloc create follows its node's own write of the claim, so no other idalloc node
 * created it since, and Cilium's agents write no idalloc annotations.
 *
 * Every step is planned by a plain function of what was read ({@linkcode firstStep},
 * {@linkcode afterClaimRead}, {@linkcode afterIdentityRead}), tested on plain data; the loop
 * applies them, bounded by `MAX_ACQUIRE_ROUNDS` writes. An ID is answered after this node's
 * reference to it is stored, from what shows the object carries the key: the create wrote it, a
 * patch's `test` checked it, or the informer shows it (as Cilium's agents answer from theirs; a
 * later change of it reaches the allocator's re-check through the watch).
 *
 * References this call wrote to IDs it did not answer (a candidate taken by another key, an
 * identity it left for an older one) are dropped from the node's reference object when it
 * answers.
 *
 * @module
 */
import type { AcquireRequest, AcquireResult, AttemptTrail } from "../../allocator/backend.ts";
import { ConflictError, CorruptEntryError, InvalidIdError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { pickCandidate, usable } from "../shared/candidates.ts";
import { confirmAfterMs, confirmClaim, retract, touchClaim } from "./claim.ts";
import type { K8sContext } from "./context.ts";
import {
  countedClient,
  isStatus,
  type KubeClient,
  type KubeObject,
  rvOf,
  unlessRefused,
} from "./kube.ts";
import {
  claimName,
  claimObject,
  type ClaimRecord,
  CREATOR_ANNOTATION,
  type IdentityRead,
  type IdentityRecord,
  readClaim,
  readIdentity,
} from "./layout.ts";
import type { LeaseKeeper } from "./lease.ts";
import { MAX_ACQUIRE_ROUNDS, MAX_LEASE_CHASES } from "./limits.ts";
import { createMaster, creatorOf, identitiesOfKey } from "./master.ts";
import { LEASES } from "./options.ts";
import { guardedMergePatch, joinPatch, repairPatch } from "./patch.ts";
import type { RefKeeper } from "./refs.ts";
import type { IdentityInformer } from "./watch.ts";

const log = idallocLogger("k8s");

/** The next step of an acquire. */
export type AcquireStep =
  /** Patch this node's reference onto identity `id`, last read carrying the key. */
  | {
    readonly kind: "join";
    readonly id: number;
    readonly annotated: boolean;
    readonly claimRv?: string;
  }
  /** Create the key's claim naming a new candidate. */
  | { readonly kind: "claim" }
  /** Read the key's claim (it exists, or existed a moment ago). */
  | { readonly kind: "readClaim" }
  /** The claim (read at `claimRv`) names `id`, which is missing: touch it before re-creating `id`. */
  | { readonly kind: "touch"; readonly id: number; readonly claimRv: string }
  /** Create identity `id` for the key, right after this node's write of the claim (at `claimRv`). */
  | { readonly kind: "create"; readonly id: number; readonly claimRv: string }
  /** Read identity `id` after a refused write. */
  | { readonly kind: "readIdentity"; readonly id: number; readonly claimRv?: string }
  /**
   * Identity `id` (at `rv`), which the claim names, is idalloc's but its labels do not decode:
   * write the key's labels again and join it.
   */
  | {
    readonly kind: "repair";
    readonly id: number;
    readonly rv: string;
    readonly annotated: boolean;
    readonly claimRv: string;
  }
  /**
   * The claim (at `claimRv`) names `from`, which cannot be the key's, or names nothing readable
   * (no `from`): move it to a new candidate.
   */
  | { readonly kind: "moveClaim"; readonly from?: number; readonly claimRv: string };

/** A claim as read: its record, or the version of one that names no key or ID (hand-made). */
export type ClaimRead = ClaimRecord | { readonly undecodable: true; readonly rv: string };

/**
 * The first step for `key` given Cilium's answer in the index: join it, or claim the key. An
 * answer outside the allocator's range is the key's ID all the same (Cilium's nodes answer it):
 * the key gets no other ID here.
 */
export function firstStep(
  key: string,
  answer: Pick<IdentityRecord, "id" | "annotated"> | undefined,
  range: AcquireRequest["range"],
): AcquireStep {
  if (answer === undefined) return { kind: "claim" };
  if (!usable(range, answer.id)) {
    throw new InvalidIdError(
      `ID ${answer.id} of key '${key}' in the store is outside this allocator's range` +
        (range ? ` [${range.min}, ${range.max}]` : "") + "; the key gets no other ID",
    );
  }
  return { kind: "join", id: answer.id, annotated: answer.annotated };
}

/**
 * After reading the key's claim: follow it. `known` is the index's identity of the ID the claim
 * names (a hint: a different key there is confirmed by a read before the claim moves). A claim
 * that names nothing readable is garbage, which must cost no key: it is moved like a stale one.
 */
export function afterClaimRead(
  key: string,
  claim: ClaimRead | undefined,
  known: Pick<IdentityRecord, "key" | "annotated"> | undefined,
  range: AcquireRequest["range"],
): AcquireStep {
  if (claim === undefined) return { kind: "claim" };
  if ("undecodable" in claim) return { kind: "moveClaim", claimRv: claim.rv };
  if (claim.key !== key) {
    throw new CorruptEntryError(
      `the claim ${claim.name} of key '${key}' names another key ('${claim.key}'): a hash ` +
        "collision or a hand-made object; remove it",
    );
  }
  if (!usable(range, claim.id)) return { kind: "moveClaim", from: claim.id, claimRv: claim.rv };
  if (known === undefined) return { kind: "touch", id: claim.id, claimRv: claim.rv };
  if (known.key === key) {
    return { kind: "join", id: claim.id, annotated: known.annotated, claimRv: claim.rv };
  }
  return { kind: "readIdentity", id: claim.id, claimRv: claim.rv };
}

/**
 * After reading identity `id` (`undefined`: it does not exist): join it when it carries the key;
 * otherwise, when a claim names it, touch the claim to re-create it (missing), repair it (labels
 * that do not decode on an object carrying idalloc references: the key's own, damaged), or move
 * the claim off it (another key's, or unreadable and never idalloc's); start over with the claim
 * when none names it (a stale index answer).
 */
export function afterIdentityRead(
  key: string,
  id: number,
  read: IdentityRead | undefined,
  claimRv: string | undefined,
): AcquireStep {
  if (read === undefined) {
    return claimRv === undefined ? { kind: "claim" } : { kind: "touch", id, claimRv };
  }
  if (read.ok && read.record.key === key) {
    return {
      kind: "join",
      id,
      annotated: read.record.annotated,
      ...(claimRv === undefined ? {} : { claimRv }),
    };
  }
  if (claimRv === undefined) return { kind: "claim" };
  if (!read.ok && read.damage.kind === "master-undecodable" && read.damage.referenced) {
    const { rv, annotated } = read.damage;
    return { kind: "repair", id, rv, annotated, claimRv };
  }
  return { kind: "moveClaim", from: id, claimRv };
}

/** What one acquire works with. */
export interface AcquireParts {
  readonly ctx: K8sContext;
  readonly lease: LeaseKeeper;
  readonly informer: IdentityInformer;
  /** The node's reference object. */
  readonly refs: RefKeeper;
}

/** The steps that write (the others read). */
const WRITES: ReadonlySet<AcquireStep["kind"]> = new Set([
  "join",
  "repair",
  "claim",
  "touch",
  "create",
  "moveClaim",
]);

/** What a step ends in: the next step, or the acquisition's result. */
type Next = AcquireStep | { readonly kind: "done"; readonly result: AcquireResult };

/** Runs the acquire protocol for `req` (see the module doc). */
export async function acquire(parts: AcquireParts, req: AcquireRequest): Promise<AcquireResult> {
  await parts.informer.waitSynced(req.signal);
  return await new AcquireRun(parts, req).run();
}

/** One acquisition: the plan's steps applied, one write (or read) each. */
class AcquireRun {
  readonly #parts: AcquireParts;
  readonly #req: AcquireRequest;
  readonly #client: KubeClient;
  readonly #claim: string;
  readonly #exclude = new Set<number>();
  #chases = 0;
  /** The identity this call created (a later chase of a replaced lease only joins it). */
  #createdId: number | undefined;
  /** Identities this call joined, then left for an older one of the key. */
  readonly #left = new Set<number>();
  /** Identities this call wrote a reference to (dropped when it answers another). */
  readonly #touched = new Set<number>();
  /** When the call started (monotonic ms): everything it decided on was read after. */
  readonly #since = performance.now();

  constructor(parts: AcquireParts, req: AcquireRequest) {
    this.#parts = parts;
    this.#req = req;
    this.#client = countedClient(parts.ctx.client, req.roundTrips);
    this.#claim = claimName(parts.ctx.resourceName, req.key);
  }

  async run(): Promise<AcquireResult> {
    const { lease, informer } = this.#parts;
    const { key, signal, range, trail } = this.#req;
    if (trail?.unconfirmed) await this.#recognizeCreate(trail);
    let step: Next = firstStep(key, informer.index.answer(key), range);
    for (let writes = 0; writes < MAX_ACQUIRE_ROUNDS;) {
      signal.throwIfAborted();
      await lease.ensureFresh(signal);
      const epoch = lease.epoch;
      if (WRITES.has(step.kind)) writes++;
      step = await this.#apply(step, epoch);
      if (step.kind === "done") {
        await this.#leave(step.result.id);
        return step.result;
      }
    }
    throw new ConflictError(
      `could not acquire key '${key}' in ${MAX_ACQUIRE_ROUNDS} writes: the store kept changing`,
    );
  }

  #apply(step: AcquireStep, epoch: string): Promise<Next> {
    switch (step.kind) {
      case "join":
        return this.#join(step, epoch);
      case "claim":
        return this.#newClaim(epoch);
      case "readClaim":
        return this.#readClaim();
      case "touch":
        return this.#touch(step);
      case "create":
        return this.#create(step, epoch);
      case "readIdentity":
        return this.#readIdentity(step);
      case "moveClaim":
        return this.#moveClaim(step);
      case "repair":
        return this.#repair(step, epoch);
    }
  }

  /**
   * The answer `id` (at `version`, the object carrying the key); a join of an older identity of
   * the key the index shows now (Cilium's answer, see the module doc); or (the lease was replaced
   * meanwhile) a join under the new epoch.
   */
  #written(id: number, version: string, epoch: string, claimRv?: string): Next {
    const { informer, lease } = this.#parts;
    if (lease.epoch === epoch) {
      const older = informer.index.answer(this.#req.key);
      if (
        older !== undefined && older.id !== id && !this.#left.has(older.id) &&
        usable(this.#req.range, older.id)
      ) {
        this.#left.add(id);
        return { kind: "join", id: older.id, annotated: older.annotated };
      }
      const created = this.#createdId === id;
      return { kind: "done", result: { id, created, version } };
    }
    // The reference names a dead epoch: write it again under the new one.
    if (++this.#chases > MAX_LEASE_CHASES) {
      throw new ConflictError(
        `the lease of '${this.#parts.ctx.node}' kept changing during acquire`,
      );
    }
    return { kind: "join", id, annotated: true, ...(claimRv ? { claimRv } : {}) };
  }

  /** Stores this node's reference to `id` under `epoch` (the node's own object, `refs.ts`). */
  async #hold(id: number, epoch: string): Promise<void> {
    this.#touched.add(id);
    const { key, signal, roundTrips } = this.#req;
    await this.#parts.refs.hold(id, key, epoch, signal, roundTrips);
  }

  /** The index's identity `id` after a write of it (`obj`), or as the index shows it. */
  #observed(id: number, obj?: KubeObject): IdentityRecord | undefined {
    if (obj !== undefined) this.#parts.informer.observe(obj);
    return this.#parts.informer.index.get(id);
  }

  /**
   * Reference first, then the identity as the index shows it (`refs.ts`: why this order keeps GC
   * from deleting what is answered): marked, or not recording the namespace → unmarked by a
   * patch testing the key; gone or another key's → read it. An index not provably current
   * (`view_freshness.ts`: its watch broke) may lack a mark GC set meanwhile — `refs.ts`' case 3,
   * which the mixed nemesis met after two API-server restarts and an etcd restart (seed 42: a
   * join answered 368 in 6 ms and GC deleted it 554 ms later) — so then the identity is read
   * after the reference is written, one GET, and judged as read.
   */
  async #join(step: Extract<AcquireStep, { kind: "join" }>, epoch: string): Promise<Next> {
    const { ctx, informer } = this.#parts;
    const { key, signal } = this.#req;
    const reread: Next = {
      kind: "readIdentity",
      id: step.id,
      ...(step.claimRv ? { claimRv: step.claimRv } : {}),
    };
    await this.#hold(step.id, epoch);
    let record = this.#observed(step.id);
    if (!informer.freshness.current) {
      const obj = await this.#client.get(ctx.identities, String(step.id), { signal });
      const read = obj === undefined ? undefined : readIdentity(obj);
      record = read?.ok ? read.record : undefined;
    }
    if (record === undefined || record.key !== key) return reread;
    if (record.mark === undefined && record.leaseNamespace !== undefined) {
      return this.#written(step.id, record.rv, epoch, step.claimRv);
    }
    const ops = joinPatch(key, record.annotated, ctx.namespace);
    const written = await patchOrUndefined(this.#client, ctx, step.id, ops, signal);
    if (written === undefined) return reread;
    this.#observed(step.id, written);
    return this.#written(step.id, rvOf(written), epoch, step.claimRv);
  }

  async #repair(step: Extract<AcquireStep, { kind: "repair" }>, epoch: string): Promise<Next> {
    const { ctx } = this.#parts;
    await this.#hold(step.id, epoch);
    const ops = repairPatch(this.#req.key, step.rv, step.annotated, ctx.namespace);
    const written = await patchOrUndefined(this.#client, ctx, step.id, ops, this.#req.signal);
    // Changed since it was read: read it again.
    if (written === undefined) return { kind: "readIdentity", id: step.id, claimRv: step.claimRv };
    this.#observed(step.id, written);
    log.warning("repaired the labels of identity {id} of {key} (its claim names it)", {
      id: step.id,
      key: this.#req.key,
    });
    return this.#written(step.id, rvOf(written), epoch, step.claimRv);
  }

  /** Drops this node's references of the key to the IDs this call wrote and did not answer. */
  async #leave(answered: number): Promise<void> {
    const others = [...this.#touched].filter((id) => id !== answered);
    if (others.length === 0) return;
    await this.#parts.refs.drop(this.#req.key, others, this.#req.signal, this.#req.roundTrips);
  }

  async #newClaim(epoch: string): Promise<Next> {
    const { ctx, informer } = this.#parts;
    const { key, range, signal } = this.#req;
    // An identity of the key may have reached the index meanwhile: never create beside it.
    const answer = informer.index.answer(key);
    if (answer !== undefined && !this.#exclude.has(answer.id)) {
      this.#exclude.add(answer.id);
      return firstStep(key, answer, range);
    }
    const id = pickCandidate(this.#req, this.#exclude);
    const obj = claimObject(this.#claim, key, id, ctx.node, ctx.settings.now());
    // The reference to the candidate goes out beside the claim: the identity is referenced from
    // the instant it exists (`refs.ts`), at no extra round trip. Both settle before either counts.
    const [claimed, held] = await Promise.allSettled([
      this.#client.create(LEASES, obj, { namespace: ctx.namespace, signal }),
      this.#hold(id, epoch),
    ]);
    if (held.status === "rejected") throw held.reason;
    if (claimed.status === "fulfilled") {
      return { kind: "create", id, claimRv: rvOf(claimed.value) };
    }
    if (!isStatus(claimed.reason, 409)) throw claimed.reason;
    return { kind: "readClaim" };
  }

  async #readClaim(): Promise<Next> {
    const { ctx, informer } = this.#parts;
    const { key, range, signal } = this.#req;
    const obj = await this.#client.get(LEASES, this.#claim, { namespace: ctx.namespace, signal });
    const record = obj === undefined ? undefined : readClaim(obj);
    const read: ClaimRead | undefined = obj === undefined || record !== undefined
      ? record
      : { undecodable: true, rv: rvOf(obj) };
    const known = record === undefined ? undefined : informer.index.get(record.id);
    return afterClaimRead(key, read, known, range);
  }

  async #touch(step: Extract<AcquireStep, { kind: "touch" }>): Promise<Next> {
    const { ctx } = this.#parts;
    const rv = await touchClaim(this.#client, ctx, this.#claim, step.claimRv, this.#req.signal);
    // Changed or removed since it was read: follow what it says now.
    return rv === undefined ? { kind: "readClaim" } : { kind: "create", id: step.id, claimRv: rv };
  }

  async #create(step: Extract<AcquireStep, { kind: "create" }>, epoch: string): Promise<Next> {
    const { ctx, lease } = this.#parts;
    const { key, signal, trail } = this.#req;
    // Stored before the create (already, when it went out beside the claim).
    await this.#hold(step.id, epoch);
    const existing = await this.#lookFirst(step.id);
    if (existing !== undefined) return existing;
    if (trail) trail.unconfirmed = { id: step.id, mark: createMark(epoch, step.claimRv) };
    const made = await createMaster(this.#client, ctx, { id: step.id, key, epoch }, signal);
    if (trail) trail.unconfirmed = undefined;
    // Taken: read what holds the ID.
    if (made === undefined) return { kind: "readIdentity", id: step.id, claimRv: step.claimRv };
    // Recorded before the confirmation: when it fails with an error, the identity stays, and the
    // allocation's next attempt joins this call's creation.
    if (trail) trail.created = step.id;
    // Slow (a stall, a loaded server): the claim may have moved meanwhile (`claim.ts`).
    if (performance.now() - this.#since > confirmAfterMs(lease.ttlMs)) {
      if (!await confirmClaim(this.#client, ctx, key, step.id, step.claimRv, signal)) {
        await retract(this.#client, ctx, made, key, signal);
        if (trail) trail.created = undefined;
        this.#exclude.add(step.id);
        return { kind: "readClaim" };
      }
    }
    this.#createdId = step.id;
    this.#observed(step.id, made);
    return this.#written(step.id, rvOf(made), epoch, step.claimRv);
  }

  /**
   * Before creating identity `id` on the index's word that the key has none: when the index is not
   * provably current (its watch broke or went silent, `view_freshness.ts`), the key's identities as
   * the store holds them now (a consistent list, `identitiesOfKey`) enter the index, and Cilium's
   * answer among them is joined instead of creating (`undefined`: create). The common path, an
   * index proven current, sends nothing more.
   *
   * Why idalloc nodes still never give a key two identities themselves (`claim.ts`): this step only
   * ever replaces a create by a join, never adds one. Every identity an idalloc node creates still
   * follows its own guarded write of the key's claim, within half a lease TTL of the call's start
   * (the read counts against it: `#since` is the start) or confirmed by another touch afterwards;
   * the claim, not this read, keeps two idalloc nodes from creating two identities of one key. The
   * read only closes what the claim cannot: Cilium's agents create without it, so an agent's
   * identity is known to this node only through the store, and a lagging index must not answer for
   * the store. A claim left naming an identity not created (`id`) costs nothing: a node following
   * it reads first too when its index lags (else its index shows the joined identity), and GC
   * removes the claim once it is quiet. What an agent creates between this read and the create is
   * the same-instant race a current index has as well (the nemesis calls it `raced`).
   */
  async #lookFirst(id: number): Promise<Next | undefined> {
    const { ctx, informer } = this.#parts;
    if (informer.freshness.current) return undefined;
    const { key, signal, range } = this.#req;
    for (const obj of await identitiesOfKey(this.#client, ctx, key, signal)) informer.observe(obj);
    const answer = informer.index.answer(key);
    if (answer === undefined || answer.id === id) return undefined;
    log.info("identity {found} of {key} found before creating {id}: the index lagged; joined", {
      found: answer.id,
      key,
      id,
    });
    return firstStep(key, answer, range);
  }

  /**
   * Whether the create of `trail.unconfirmed` (whose answer was lost) landed (see the module
   * doc). Records it in `trail.created`; clears `unconfirmed` either way.
   */
  async #recognizeCreate(trail: AttemptTrail): Promise<void> {
    const { ctx, informer } = this.#parts;
    const { id, mark } = trail.unconfirmed!;
    const signal = this.#req.signal;
    const obj = await this.#client.get(ctx.identities, String(id), { signal });
    const claim = obj === undefined
      ? undefined
      : await this.#client.get(LEASES, this.#claim, { namespace: ctx.namespace, signal });
    trail.unconfirmed = undefined;
    if (obj === undefined || claim === undefined) return;
    informer.observe(obj);
    const read = readIdentity(obj);
    if (!read.ok || read.record.key !== this.#req.key) return;
    const creator = obj.metadata.annotations?.[CREATOR_ANNOTATION] ?? "";
    const epoch = creator.slice(ctx.node.length + 1);
    if (creator === creatorOf(ctx.node, epoch) && createMark(epoch, rvOf(claim)) === mark) {
      trail.created = id;
    }
  }

  async #readIdentity(step: Extract<AcquireStep, { kind: "readIdentity" }>): Promise<Next> {
    const { ctx, informer } = this.#parts;
    const obj = await this.#client.get(ctx.identities, String(step.id), {
      signal: this.#req.signal,
    });
    if (obj !== undefined) informer.observe(obj);
    const read = obj === undefined ? undefined : readIdentity(obj);
    return afterIdentityRead(this.#req.key, step.id, read, step.claimRv);
  }

  async #moveClaim(step: Extract<AcquireStep, { kind: "moveClaim" }>): Promise<Next> {
    const { ctx } = this.#parts;
    if (step.from !== undefined) this.#exclude.add(step.from);
    const id = pickCandidate(this.#req, this.#exclude);
    const body = guardedMergePatch(
      claimObject(this.#claim, this.#req.key, id, ctx.node, ctx.settings.now()),
      step.claimRv,
    );
    try {
      const moved = await this.#client.patch(LEASES, this.#claim, body, {
        type: "merge",
        namespace: ctx.namespace,
        signal: this.#req.signal,
      });
      return { kind: "create", id, claimRv: rvOf(moved) };
    } catch (err) {
      // Another node moved (or GC removed) the claim first: follow what it says now.
      if (!isStatus(err, 409) && !isStatus(err, 404)) throw err;
      return { kind: "readClaim" };
    }
  }
}

/** What a create of an identity leaves to recognise it by: its reference's epoch, the claim's version. */
function createMark(epoch: string, claimRv: string): string {
  return JSON.stringify([epoch, claimRv]);
}

/**
 * Applies a JSON patch to identity `id`; `undefined` when the API server refused it because the
 * object is gone (404) or no longer what the patch tested (422).
 */
export async function patchOrUndefined(
  client: KubeClient,
  ctx: K8sContext,
  id: number,
  ops: unknown,
  signal: AbortSignal,
): Promise<KubeObject | undefined> {
  return await unlessRefused(
    client.patch(ctx.identities, String(id), ops, { type: "json", signal }),
    404,
    422,
  );
}
