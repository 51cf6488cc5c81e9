/**
 * The node's `Lease` (`coordination.k8s.io/v1`, `idalloc-node-<node>` in the coordination
 * namespace): `spec.holderIdentity` = the node, `renewTime` + `leaseDurationSeconds` = its end,
 * annotation `idalloc.io/epoch` = a random value per grant. References carry the epoch; they are
 * live while the Lease is live and carries it (`liveness.ts`).
 *
 * - **Open.** A writable session reads the Lease: absent → create it; live (another process, or
 *   this node before a crash) → `NodeInUseError` unless `restart`; lapsed, or `restart` → take it
 *   over with a new epoch (a write guarded by its resource version).
 * - **Renewal** every ttl/3: a merge patch guarded by the Lease's resource version, setting
 *   `renewTime` (not an update: that would re-create a Lease an operator deleted, reviving its
 *   epoch). A Lease within the skew margin of its end (own clock) is never renewed: a new
 *   epoch replaces it (old references are dead for everyone) and `onLeaseReplaced` runs. The
 *   telemetry counts each renewal the API server confirmed and each that threw
 *   (`idalloc.lease.renewals`), as Deno KV's and etcd's keepers do; a replacement is no renewal.
 * - **Lost.** A renewal that finds the Lease under another live epoch (another process took the
 *   name with `restart`) does not take it back: the claim lapses, the allocator fences, and
 *   `lastError` says why; once that Lease lapses the node takes a new epoch. Meanwhile writes
 *   fail with a retryable `ConflictError` (its `cause` a `NodeInUseError`): unlike at open, where
 *   `NodeInUseError` tells the caller to stop, this heals by itself.
 *
 * - **Clock.** Every write answers with the server's time of it: the keeper measures this node's
 *   clock against the server's (`clock.ts`), writes the Lease's times on the server's clock,
 *   warns when the offset passes `maxClockSkewMs`, and refuses to open
 *   (`ClockSkewError`) past what the key claims allow.
 * - **Namespace.** A create in a coordination namespace that does not exist is
 *   `NamespaceNotFoundError` (not a Lease "that kept changing").
 *
 * The decisions are plain functions ({@linkcode planOpen}, {@linkcode classifyRefusal}), tested on
 * plain data; {@linkcode LeaseKeeper} applies them.
 *
 * @module
 */
import { abortable } from "../../abort.ts";
import { ConflictError, errorMessage, NodeInUseError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { claimUntil, leaseStale, RenewalSchedule } from "../shared/renewal.ts";
import type { K8sContext } from "./context.ts";
import {
  clockSkewBound,
  ClockSkewError,
  describeOffset,
  serverTimeOf,
  STAMP_ANNOTATIONS,
} from "./clock.ts";
import { namespaceMissing } from "./coordination.ts";
import { type KubeObject, unlessRefused } from "./kube.ts";
import { nodeLeaseName, nodeLeaseObject, type NodeLeaseRecord, readNodeLease } from "./layout.ts";
import { EPOCH_CHARS } from "./limits.ts";
import { leaseLive, onLocalClock } from "./liveness.ts";
import { LEASES } from "./options.ts";
import { guardedMergePatch } from "./patch.ts";

const log = idallocLogger("k8s", "lease");

/** How many read-decide-write rounds opening or replacing a lease tries before giving up. */
const MAX_LEASE_ROUNDS = 5;

/** How long `close()` tries to delete the Lease of a session that holds nothing, in ms. */
const RELEASE_ON_CLOSE_MS = 2_000;

/** What opening a writable session does with the node's Lease as read. */
export type OpenPlan =
  | { readonly kind: "create" }
  | { readonly kind: "take"; readonly rv: string }
  | { readonly kind: "inUse"; readonly expiresAt?: number };

/**
 * The plan for the node's Lease `existing` at `now`: create it when absent; refuse a live one
 * unless `restart` (this process is that node restarting); take over a lapsed one.
 */
export function planOpen(
  existing: NodeLeaseRecord | undefined,
  now: number,
  maxClockSkewMs: number,
  restart: boolean,
): OpenPlan {
  if (existing === undefined) return { kind: "create" };
  if (!restart && leaseLive(existing, now, maxClockSkewMs)) {
    return {
      kind: "inUse",
      ...(existing.expiresAt === undefined ? {} : { expiresAt: existing.expiresAt }),
    };
  }
  return { kind: "take", rv: existing.rv };
}

/** What the Lease says after a guarded write of it was refused. */
export type Refusal =
  /** Still this node's epoch (someone else edited the object): write again at `rv`. */
  | { readonly kind: "retry"; readonly rv: string }
  /** Gone, or another epoch that lapsed: a new epoch may replace it (at `rv`, or by create). */
  | { readonly kind: "replace"; readonly rv?: string }
  /** Another epoch holds it and is live: lost; not taken back while it lives. */
  | { readonly kind: "lost"; readonly epoch?: string; readonly expiresAt?: number };

/** Classifies the Lease `current` read after a refused write of epoch `epoch` (see {@linkcode Refusal}). */
export function classifyRefusal(
  current: NodeLeaseRecord | undefined,
  epoch: string,
  now: number,
  maxClockSkewMs: number,
): Refusal {
  if (current === undefined) return { kind: "replace" };
  if (current.epoch === epoch) return { kind: "retry", rv: current.rv };
  if (leaseLive(current, now, maxClockSkewMs)) {
    return {
      kind: "lost",
      ...(current.epoch === undefined ? {} : { epoch: current.epoch }),
      ...(current.expiresAt === undefined ? {} : { expiresAt: current.expiresAt }),
    };
  }
  return { kind: "replace", rv: current.rv };
}

/** A new random epoch. */
export function newEpoch(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(EPOCH_CHARS / 2));
  return [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/** Keeps this node's Lease (see the module doc). */
export class LeaseKeeper {
  readonly #ctx: K8sContext;
  readonly #ttlMs: number;
  readonly #durationSeconds: number;
  readonly #onReplaced: () => void;
  readonly #signal: AbortSignal;
  readonly #schedule: RenewalSchedule;
  #epoch = "";
  #rv: string | undefined;
  #acquired = 0;
  #renewedAt = 0;
  #claimUntil = 0;
  #lost: { epoch?: string; expiresAt?: number } | undefined;
  #replacements = 0;
  /**
   * The stamp annotation (`clock.ts`) the Lease carried at version `rv`, as this keeper last saw it
   * (its own write's answer, or a read): the next write at that version sets the other one.
   */
  #stamped: { readonly rv: string; readonly stamp: string | undefined } | undefined;
  /** The offset last warned about (0: none). */
  #skewWarned = 0;
  /** The last renewal failure, while the last attempt failed. */
  lastError: string | undefined;

  /**
   * @param ctx the backend's context
   * @param ttlMs the lease's lifetime
   * @param onReplaced called after the epoch changed (references of the old one are dead)
   * @param signal aborted when the session closes
   * @param onTick called after each timed renewal, whatever its outcome
   */
  constructor(
    ctx: K8sContext,
    ttlMs: number,
    onReplaced: () => void,
    signal: AbortSignal,
    onTick: () => void = () => {},
  ) {
    this.#ctx = ctx;
    this.#ttlMs = ttlMs;
    this.#durationSeconds = Math.max(1, Math.ceil(ttlMs / 1000));
    this.#onReplaced = onReplaced;
    this.#signal = signal;
    this.#schedule = new RenewalSchedule(ttlMs, () => this.#renew(), onTick);
  }

  /** The lease's lifetime, in ms. */
  get ttlMs(): number {
    return this.#ttlMs;
  }

  /** The current epoch; references are written with it. */
  get epoch(): string {
    return this.#epoch;
  }

  /** When the lease ends unless renewed (ms, own clock). */
  get expiresAt(): number {
    return this.#renewedAt + this.#ttlMs;
  }

  /** Until when (on `Date.now()`'s scale) this node's references are certainly live for all. */
  get claimValidUntil(): number {
    return this.#claimUntil;
  }

  /** How often the epoch was replaced since the session opened. */
  get replacements(): number {
    return this.#replacements;
  }

  /** Whether another process holds the Lease now (see the module doc). */
  get lost(): boolean {
    return this.#lost !== undefined;
  }

  /** Takes the Lease (see {@linkcode planOpen}) and starts renewing it. */
  async start(restart: boolean, signal: AbortSignal): Promise<void> {
    const { settings } = this.#ctx;
    for (let round = 0; round < MAX_LEASE_ROUNDS; round++) {
      const existing = await this.#read(signal);
      const plan = planOpen(existing, settings.now(), settings.maxClockSkewMs, restart);
      if (plan.kind === "inUse") throw new NodeInUseError(this.#ctx.node, plan.expiresAt);
      if (await this.#write(newEpoch(), plan.kind === "take" ? plan.rv : undefined, signal)) {
        // Refused before the node writes anything else; closing the session deletes the Lease.
        this.#checkSkew();
        // The first write measured a skew: its times go on the server's clock at once.
        if (this.#ctx.clock.offset !== 0) await this.#write(this.#epoch, this.#rv, signal, true);
        this.#schedule.start();
        return;
      }
    }
    throw new ConflictError(`the Lease of node '${this.#ctx.node}' kept changing while opening`);
  }

  /**
   * Replaces the lease now if it is too close to its end to be renewed, so that a reference is
   * never written under an epoch others may judge dead; throws a retryable
   * {@linkcode ConflictError} (its `cause` a {@linkcode NodeInUseError}) while another process
   * holds the Lease: the node takes a new epoch once that Lease lapses.
   */
  async ensureFresh(signal: AbortSignal): Promise<void> {
    if (this.#lost) throw this.#lostError();
    if (!this.#stale()) return;
    // The queue may hold renewals bound only by the session: the call's own signal bounds its wait.
    await abortable(
      this.#schedule.serial(() => this.#stale() ? this.#replace("expired", signal) : undefined),
      signal,
    );
    if (this.#lost) throw this.#lostError();
  }

  /** Renews (or replaces) the lease now and waits for the answer; failures go to `lastError`. */
  renewNow(): Promise<void> {
    return this.#schedule.serial(() => this.#renew());
  }

  /**
   * Stops renewing. The Lease stays and lapses on its own, unless `release`: then it is deleted if
   * it is still the one this keeper wrote last (guarded by that version; best effort, for
   * {@linkcode RELEASE_ON_CLOSE_MS}), so that the name is free at once. Only a session that holds
   * no reference may release: deleting the Lease kills every reference of its epoch.
   */
  async close(release = false): Promise<void> {
    await this.#schedule.stop();
    if (!release || this.#rv === undefined || this.#lost) return;
    const { client, namespace, node } = this.#ctx;
    try {
      await client.delete(LEASES, nodeLeaseName(node), {
        namespace,
        resourceVersion: this.#rv,
        signal: AbortSignal.timeout(RELEASE_ON_CLOSE_MS),
      });
    } catch (err) {
      log.debug("deleting the Lease of {node} on close failed: {err}", { node, err });
    }
  }

  #lostError(): ConflictError {
    const cause = new NodeInUseError(this.#ctx.node, this.#lost?.expiresAt);
    return new ConflictError(
      `the Lease of node ${this.#ctx.node} was taken by another process; this node takes a new ` +
        "epoch once that Lease lapses (retry then)",
      { cause },
    );
  }

  #stale(): boolean {
    const { now, maxClockSkewMs } = this.#ctx.settings;
    return leaseStale(now(), this.expiresAt, maxClockSkewMs);
  }

  async #renew(): Promise<void> {
    if (this.#schedule.closed) return;
    const signal = this.#signal;
    try {
      if (this.#lost || this.#stale()) return await this.#replace("expired", signal);
      for (let round = 0; round < 2; round++) {
        if (await this.#write(this.#epoch, this.#rv, signal, true)) {
          this.#ctx.telemetry.renewal();
          return;
        }
        const refusal = await this.#refused(this.#epoch, signal);
        if (refusal.kind === "lost") return;
        if (refusal.kind === "replace") return await this.#replace("the Lease was removed", signal);
      }
    } catch (err) {
      if (signal.aborted) return;
      this.#ctx.telemetry.renewal(err);
      this.lastError = `lease renewal failed: ${errorMessage(err)}`;
      log.warning("renewing the lease of {node} failed: {err}", { node: this.#ctx.node, err });
    }
  }

  /** Takes a new epoch (unless another process holds the Lease live), then `onReplaced`. */
  async #replace(why: string, signal: AbortSignal): Promise<void> {
    const old = this.#epoch;
    if (this.#lost && (await this.#refused(old, signal)).kind === "lost") return;
    for (let round = 0; round < MAX_LEASE_ROUNDS; round++) {
      const epoch = newEpoch();
      if (await this.#write(epoch, this.#rv, signal)) {
        this.#replacements++;
        log.warning("lease epoch {old} of {node} replaced by {epoch}: {why}", {
          old,
          node: this.#ctx.node,
          epoch,
          why,
        });
        try {
          this.#onReplaced();
        } catch (err) {
          log.error("onLeaseReplaced callback failed: {err}", { err });
        }
        return;
      }
      if ((await this.#refused(old, signal)).kind === "lost") return;
    }
    throw new ConflictError(`the Lease of node '${this.#ctx.node}' kept changing`);
  }

  /**
   * After a refused write of `epoch`: reads the Lease and records what it says (see
   * {@linkcode classifyRefusal}): the resource version to write at next, or the loss.
   */
  async #refused(epoch: string, signal: AbortSignal): Promise<Refusal> {
    const refusal = classifyRefusal(await this.#read(signal), epoch, this.#now(), this.#skew());
    if (refusal.kind === "lost") this.#markLost(refusal);
    else this.#rv = refusal.rv;
    return refusal;
  }

  /**
   * Writes the Lease with `epoch`, renewed now: an update at `rv`, or a create without one.
   * Returns whether it was written (false: the API server refused it as changed or gone).
   */
  async #write(
    epoch: string,
    rv: string | undefined,
    signal: AbortSignal,
    renewal = false,
  ): Promise<boolean> {
    const { client, namespace, node, clock } = this.#ctx;
    const now = this.#now();
    // The Lease's times are on the server's clock, as this node best knows it (`clock.ts`).
    const serverNow = now + clock.offset;
    const acquired = renewal ? this.#acquired : serverNow;
    const obj = nodeLeaseObject(node, epoch, this.#durationSeconds, serverNow, acquired);
    // So that the server stamps this write's time (`clock.ts`), the write sets the stamp the Lease
    // does not carry at the version it is guarded by, and removes the other: the set of fields it
    // writes always differs from the stored one. Not by counting this keeper's writes: a new
    // process's first write (a node restarting takes its own Lease) or a retry after a refused
    // write would set the stamp already there, and the server would answer with the time of an
    // earlier write — seed 3 of the mixed Kubernetes runs: a worker restarted 4 s after its last
    // renewal measured its clock "4.7 s ahead" and refused to open (`ClockSkewError`).
    const seen = rv !== undefined && this.#stamped?.rv === rv ? this.#stamped : undefined;
    const [stamp, unstamp] = seen?.stamp === STAMP_ANNOTATIONS[0]
      ? [STAMP_ANNOTATIONS[1], STAMP_ANNOTATIONS[0]]
      : STAMP_ANNOTATIONS;
    // Every version this keeper writes at comes from its own write or a read, so it knows the
    // stamp there; should one not, the write may set the stamp already stored, and its reply's
    // time is then no measure of the clock.
    const measurable = rv === undefined || seen !== undefined;
    obj.metadata.annotations = { ...obj.metadata.annotations, [stamp]: "" };
    const patch = guardedMergePatch(obj, rv ?? "") as {
      metadata: { annotations: Record<string, string | null> };
    };
    // A copy: the create sends `obj` itself, whose map would otherwise carry the removal too (a
    // create stores a null annotation as "": a new Lease carried both stamps).
    patch.metadata.annotations = { ...patch.metadata.annotations, [unstamp]: null };
    const written = await unlessRefused(
      // Never `update`: it would re-create a deleted Lease (see `patch.ts`).
      rv === undefined
        ? client.create(LEASES, obj, { namespace, signal }).catch((err) => {
          throw namespaceMissing(err, namespace) ?? err;
        })
        : client.patch(LEASES, nodeLeaseName(node), patch, {
          type: "merge",
          namespace,
          signal,
        }),
      409,
      404,
    );
    if (written === undefined) return false;
    this.#see(written);
    if (measurable) this.#measure(written, now);
    this.#epoch = epoch;
    this.#rv = String(written.metadata.resourceVersion ?? "");
    this.#acquired = acquired;
    this.#renewedAt = now;
    this.#claimUntil = claimUntil(now + this.#ttlMs, this.#skew(), this.#now());
    this.#lost = undefined;
    this.lastError = undefined;
    return true;
  }

  /** Records which stamp annotation the Lease `obj` carries at its version (see `#write`). */
  #see(obj: KubeObject): void {
    const annotations = obj.metadata.annotations ?? {};
    const carried = STAMP_ANNOTATIONS.filter((a) => a in annotations);
    this.#stamped = {
      rv: String(obj.metadata.resourceVersion ?? ""),
      stamp: carried.length === 1 ? carried[0] : undefined,
    };
  }

  /**
   * Measures the clock against the server's time of the write that returned `written`, sent at
   * `sentAt`; warns when the offset passes the skew margin (again only once it changed by more).
   */
  #measure(written: KubeObject, sentAt: number): void {
    const serverTime = serverTimeOf(written);
    if (serverTime === undefined) return;
    const offset = this.#ctx.clock.sample(serverTime, sentAt, this.#now());
    const skew = this.#skew();
    if (Math.abs(offset) <= skew) {
      this.#skewWarned = 0;
      return;
    }
    if (Math.abs(offset - this.#skewWarned) <= skew) return;
    this.#skewWarned = offset;
    log.warning(
      "the clock of node {node} is {offset} the API server's, more than maxClockSkewMs " +
        "({skew} ms): its Lease times are corrected, but set this machine's clock (NTP)",
      { node: this.#ctx.node, offset: describeOffset(offset), skew },
    );
  }

  /** Throws {@linkcode ClockSkewError} when the measured offset is past {@linkcode clockSkewBound}. */
  #checkSkew(): void {
    const offset = this.#ctx.clock.offset;
    const bound = clockSkewBound(this.#ctx.settings, this.#ttlMs);
    if (Math.abs(offset) > bound) throw new ClockSkewError(this.#ctx.node, offset, bound);
  }

  #markLost(refusal: Extract<Refusal, { kind: "lost" }>): void {
    if (this.#lost === undefined) {
      log.error("the Lease of node {node} was taken by another process (epoch {epoch})", {
        node: this.#ctx.node,
        epoch: refusal.epoch ?? "none",
      });
    }
    this.#lost = { epoch: refusal.epoch, expiresAt: refusal.expiresAt };
    this.lastError = `lease lost: another process holds the Lease of node '${this.#ctx.node}' ` +
      `(epoch ${refusal.epoch ?? "none"}); not taken back while it is live`;
  }

  async #read(signal: AbortSignal): Promise<NodeLeaseRecord | undefined> {
    const { client, namespace, node } = this.#ctx;
    const obj = await client.get(LEASES, nodeLeaseName(node), { namespace, signal });
    if (obj === undefined) return undefined;
    this.#see(obj);
    // A Lease under the name whose holder is not this node (hand-made): read as lapsed.
    const lease = readNodeLease(obj);
    return lease?.node === node
      ? onLocalClock(lease, this.#ctx.clock.offset)
      : { name: nodeLeaseName(node), node, rv: String(obj.metadata.resourceVersion ?? "") };
  }

  #now(): number {
    return this.#ctx.settings.now();
  }

  #skew(): number {
    return this.#ctx.settings.maxClockSkewMs;
  }
}
