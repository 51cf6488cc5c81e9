/**
 * The node's lease: one record `[...P, "lease", node]` → `{ lease, expiresAt }`, renewed every
 * ttl/3 by a commit guarded on the record's own last versionstamp.
 *
 * A lease is never renewed once its `expiresAt` (own clock) has passed or is within
 * `maxClockSkewMs`: another node, whose clock may run ahead, could already judge its references
 * dead and collect their IDs, so extending it would revive references that others treat as gone.
 * Instead the node takes a new lease id (old references are dead for everybody) and the allocator
 * re-creates its references. The same happens when the record was deleted or overwritten.
 *
 * A session claims the record when it opens: if another session's lease in it is live (judged as
 * operator tools judge it, {@linkcode nodeIsLive}), opening fails with {@linkcode NodeInUseError}
 * unless the caller says it is that node restarting. The claim's write is guarded by the
 * versionstamp of the record it read, so of two sessions claiming one name at once only one wins.
 * A session that holds no reference when it closes deletes its record (guarded the same way), so
 * that its name is free at once, as an etcd session revokes its empty leases.
 *
 * @module
 */
import { errorMessage, NodeInUseError, StoreUnavailableError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { claimUntil, leaseStale, RenewalSchedule } from "../shared/renewal.ts";
import { commit, get, type KvStats, nonce } from "./client.ts";
import type { KvContext } from "./context.ts";
import { nodeIsLive } from "./liveness.ts";
import { decode } from "./schema.ts";

const log = idallocLogger("kv", "lease");

/** How long `close()` tries to delete the lease record of a session that holds nothing, in ms. */
const RELEASE_ON_CLOSE_MS = 2_000;

/** Keeps this node's lease alive. */
export class LeaseKeeper {
  readonly #ctx: KvContext;
  readonly #stats: KvStats;
  readonly #ttlMs: number;
  readonly #onReplaced: () => void;
  readonly #signal: AbortSignal;
  #id = "";
  #expiresAt = 0;
  /** `expiresAt` less the skew margin, on `Date.now()`'s scale: read on every answer. */
  #claimUntil = 0;
  #versionstamp: string | null = null;
  readonly #schedule: RenewalSchedule;
  #replacements = 0;
  /** The last renewal failure, if the last attempt failed. */
  lastError: string | undefined;

  /**
   * @param ctx the store
   * @param stats counters for the lease's own round trips
   * @param ttlMs lease lifetime
   * @param onReplaced called after the lease id changed (references of the old one are dead)
   * @param signal aborted when the session closes
   */
  constructor(
    ctx: KvContext,
    stats: KvStats,
    ttlMs: number,
    onReplaced: () => void,
    signal: AbortSignal,
  ) {
    this.#ctx = ctx;
    this.#stats = stats;
    this.#ttlMs = ttlMs;
    this.#onReplaced = onReplaced;
    this.#signal = signal;
    this.#schedule = new RenewalSchedule(ttlMs, () => this.#renew());
  }

  /** The current lease id; references are written with it. */
  get id(): string {
    return this.#id;
  }

  /** When the current lease expires (ms, own clock). */
  get expiresAt(): number {
    return this.#expiresAt;
  }

  /**
   * Until when (`Date.now()` scale) this node's references are certainly alive for every observer:
   * others judge the lease dead at `expiresAt + skew` on their clocks, which may run ahead of ours
   * by the skew. Precomputed at each renewal, because the allocator reads it on every answer.
   */
  get claimValidUntil(): number {
    return this.#claimUntil;
  }

  /** How often the lease was replaced since the session opened. */
  get replacements(): number {
    return this.#replacements;
  }

  /**
   * Writes the first lease record and starts renewing. The record of a live lease (another
   * session's) is refused with {@linkcode NodeInUseError} unless `restart` (this process is that
   * node restarting), which overwrites it.
   */
  async start(signal: AbortSignal, restart = false): Promise<void> {
    if (restart) await this.#write(nonce(), signal);
    else await this.#claim(signal);
    this.#schedule.start();
  }

  /**
   * Writes a new lease into the record if no live lease is there, guarded by the versionstamp of
   * what was read; a record that changed in between (another session claiming the name at the
   * same moment) is read again and judged again.
   */
  async #claim(signal: AbortSignal): Promise<void> {
    const { layout, settings } = this.#ctx;
    const key = layout.lease(settings.node);
    for (;;) {
      const entry = await get(this.#ctx, this.#stats, key, signal);
      const value = entry.versionstamp === null
        ? undefined
        : decode.lease(entry as Deno.KvEntry<unknown>);
      const record = { value, versionstamp: entry.versionstamp };
      if (nodeIsLive(record, settings.now(), settings.maxClockSkewMs)) {
        throw new NodeInUseError(settings.node, value!.expiresAt);
      }
      const guarded = this.#ctx.kv.atomic().check({ key, versionstamp: entry.versionstamp });
      if (await this.#commitRecord(nonce(), guarded, signal)) return;
    }
  }

  /**
   * Replaces the lease now if it is too close to expiry to be renewed (a stalled timer, a
   * suspended process), so that a new reference is never written under a lease others judge dead.
   */
  async ensureFresh(signal: AbortSignal): Promise<void> {
    if (!this.#stale()) return;
    await this.#schedule.serial(() => this.#stale() ? this.#replace("expired", signal) : undefined);
  }

  /** Renews (or replaces) the lease now; used by the timer and by tests. */
  renewNow(): Promise<void> {
    return this.#schedule.serial(() => this.#renew());
  }

  /**
   * Stops renewing. The record stays and lapses on its own, unless `release`: then it is deleted
   * if it is still the one this keeper wrote last (best effort, for {@linkcode RELEASE_ON_CLOSE_MS}),
   * so that the name is free at once. Only a session that holds no reference may release: deleting
   * the record kills every reference of its lease.
   */
  async close(release = false): Promise<void> {
    await this.#schedule.stop();
    if (!release || this.#versionstamp === null) return;
    const key = this.#ctx.layout.lease(this.#ctx.settings.node);
    const op = this.#ctx.kv.atomic().check({ key, versionstamp: this.#versionstamp }).delete(key);
    try {
      await commit(this.#stats, op, AbortSignal.timeout(RELEASE_ON_CLOSE_MS));
    } catch (err) {
      log.debug("deleting the lease record of {node} on close failed: {err}", {
        node: this.#ctx.settings.node,
        err,
      });
    }
  }

  #stale(): boolean {
    const { now, maxClockSkewMs } = this.#ctx.settings;
    return leaseStale(now(), this.#expiresAt, maxClockSkewMs);
  }

  async #renew(): Promise<void> {
    if (this.#schedule.closed) return;
    try {
      if (this.#stale()) return await this.#replace("expired", this.#signal);
      const key = this.#ctx.layout.lease(this.#ctx.settings.node);
      const op = this.#ctx.kv.atomic().check({ key, versionstamp: this.#versionstamp });
      const expiresAt = this.#ctx.settings.now() + this.#ttlMs;
      this.#set(op, this.#id, expiresAt);
      const res = await commit(this.#stats, op, this.#signal);
      if (!res.ok) return await this.#replace("record changed by someone else", this.#signal);
      this.#setExpiry(expiresAt);
      this.#versionstamp = res.versionstamp;
      this.lastError = undefined;
      this.#stats.telemetry?.renewal();
    } catch (err) {
      if (this.#signal.aborted) return;
      this.#stats.telemetry?.renewal(err);
      this.lastError = `lease renewal failed: ${errorMessage(err)}`;
      log.warning("renewing the lease of {node} failed: {err}", {
        node: this.#ctx.settings.node,
        err,
      });
    }
  }

  async #replace(why: string, signal: AbortSignal): Promise<void> {
    const old = this.#id;
    await this.#write(nonce(), signal);
    this.#replacements++;
    log.warning("lease {old} of {node} replaced by {lease}: {why}", {
      old,
      node: this.#ctx.settings.node,
      lease: this.#id,
      why,
    });
    try {
      this.#onReplaced();
    } catch (err) {
      log.error("onLeaseReplaced callback failed: {err}", { err });
    }
  }

  async #write(id: string, signal: AbortSignal): Promise<void> {
    if (!await this.#commitRecord(id, this.#ctx.kv.atomic(), signal)) {
      throw new StoreUnavailableError("unguarded lease write was refused");
    }
  }

  /** Commits `op` with the record of lease `id` set; on success, that lease is this keeper's. */
  async #commitRecord(id: string, op: Deno.AtomicOperation, signal: AbortSignal): Promise<boolean> {
    const expiresAt = this.#ctx.settings.now() + this.#ttlMs;
    const res = await commit(this.#stats, this.#set(op, id, expiresAt), signal);
    if (!res.ok) return false;
    this.#id = id;
    this.#setExpiry(expiresAt);
    this.#versionstamp = res.versionstamp;
    this.lastError = undefined;
    return true;
  }

  #setExpiry(expiresAt: number): void {
    const { now, maxClockSkewMs } = this.#ctx.settings;
    this.#expiresAt = expiresAt;
    this.#claimUntil = claimUntil(expiresAt, maxClockSkewMs, now());
  }

  #set(op: Deno.AtomicOperation, id: string, expiresAt: number): Deno.AtomicOperation {
    const { layout, settings } = this.#ctx;
    // expireIn is only a backstop for records of nodes that never come back; liveness is judged
    // from expiresAt. It must outlast expiresAt plus the skew margin of every observer.
    return op.set(layout.lease(settings.node), { lease: id, expiresAt }, {
      expireIn: this.#ttlMs + 2 * settings.maxClockSkewMs,
    });
  }
}
