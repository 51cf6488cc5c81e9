/**
 * The node's leases, as Cilium's etcd lease manager keeps them: references share leases, at most
 * {@linkcode MAX_KEYS_PER_LEASE} keys each (etcd's put latency grows with keys per lease), one
 * grant in flight at a time, all kept alive over one keepalive stream at a third of the TTL.
 *
 * A lease is declared lost when etcd answers a keepalive with TTL ≤ 0 (`lease not found`), when a
 * write names it and etcd says it does not exist, or when no keepalive succeeded before its
 * deadline. A lost lease is dropped with its bindings, a new one is granted in the background
 * and the owner's `onLost` runs at once (the allocator then re-creates every held reference).
 *
 * @example
 * ```ts ignore
 * // ignored: needs a client of a running etcd (tests/backends/etcd/lease.test.ts runs it)
 * const leases = new LeaseManager(client, 60, () => resyncEverything());
 * await leases.start(signal);
 * const lease = await leases.leaseFor("cilium/state/identities/v1/value/k;/n1", signal);
 * ```
 *
 * @module
 */
import type { ILeaseKeepAliveRequest, ILeaseKeepAliveResponse } from "../../deps/etcd3.ts";
import { idallocLogger } from "../../log.ts";
import { closeStream, type DuplexStream, type EtcdClient, LeaseNotFound } from "./client.ts";
import { abortable, sleep } from "../../abort.ts";
import { MAX_KEYS_PER_LEASE } from "./limits.ts";
import { TaskGroup } from "../../task_group.ts";

const log = idallocLogger("etcd", "lease");

/** How long `close()` tries to revoke leases that carry no reference, in ms. */
const REVOKE_ON_CLOSE_MS = 2_000;

interface LeaseState {
  readonly id: string;
  readonly ttlMs: number;
  keys: number;
  /** Conservative local deadline: send time of the last acknowledged keepalive + TTL. */
  expiresAt: number;
  /**
   * Send times of this lease's keepalives on the current stream that etcd has not answered yet,
   * oldest first. The stream answers in order, so each answer is timed from its own request: a
   * late answer (the process was stopped, etcd was slow) never extends the deadline from a later
   * request's send time, which would claim more than etcd granted.
   */
  sent: number[];
}

interface KeepAliveStream extends DuplexStream {
  write(item: ILeaseKeepAliveRequest): void;
}

/** Grants, shares, renews and replaces the leases of one session. */
export class LeaseManager {
  readonly #client: EtcdClient;
  readonly #ttlSec: number;
  readonly #onLost: (leaseId: string, reason: string) => void;
  readonly #leases = new Map<string, LeaseState>();
  readonly #bindings = new Map<string, string>();
  /** The closing signal, the grant and stream opening in flight, and the idempotent close. */
  readonly #group = new TaskGroup("etcd lease manager");
  #current: string | undefined;
  #granting: Promise<string> | undefined;
  #stream: KeepAliveStream | undefined;
  #opening: Promise<void> | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** A lost lease could not be replaced yet; the tick retries the grant. */
  #replacementPending = false;
  /** When the keepalive stream last answered (or was opened). */
  #streamSeen = 0;
  /** The earliest `expiresAt` of a held lease. */
  #earliest: number | undefined;
  /** The lease that carries the node's presence key (see `presence.ts`), if any. */
  #pinned: string | undefined;

  /**
   * @param client the connection
   * @param ttlSec lease TTL in seconds
   * @param onLost called synchronously when a lease is found lost
   */
  constructor(
    client: EtcdClient,
    ttlSec: number,
    onLost: (leaseId: string, reason: string) => void,
  ) {
    this.#client = client;
    this.#ttlSec = ttlSec;
    this.#onLost = onLost;
  }

  /** Leases held. */
  get count(): number {
    return this.#leases.size;
  }

  /**
   * The earliest local deadline of a held lease (`undefined` with no lease). Kept up to date as
   * leases are granted, renewed and lost: the allocator reads it on every answer.
   */
  get expiresAt(): number | undefined {
    return this.#earliest;
  }

  #updateEarliest(): void {
    let min: number | undefined;
    for (const l of this.#leases.values()) {
      min = min === undefined ? l.expiresAt : Math.min(min, l.expiresAt);
    }
    this.#earliest = min;
  }

  /** Whether `leaseId` is one of this session's live leases. */
  isLive(leaseId: string): boolean {
    return this.#leases.has(leaseId);
  }

  /** The live lease `refKey` is bound to, if any. */
  boundLease(refKey: string): string | undefined {
    const id = this.#bindings.get(refKey);
    return id !== undefined && this.#leases.has(id) ? id : undefined;
  }

  /**
   * The lease to write `refKey` with, reserved for it: its current binding if alive, else the
   * current lease while it has room, else any lease with room, else a new grant.
   */
  async leaseFor(refKey: string, signal: AbortSignal): Promise<string> {
    for (;;) {
      const bound = this.boundLease(refKey);
      if (bound !== undefined) return bound;
      const pick = this.#withRoom();
      if (pick !== undefined) {
        this.#bind(refKey, pick);
        return pick;
      }
      await abortable(this.#grant(), signal);
    }
  }

  /**
   * A live lease to put a key on that is no reference (the node's presence key): the current
   * lease, else any held one, else a new grant. Binds nothing.
   */
  async anyLease(signal: AbortSignal): Promise<string> {
    for (;;) {
      if (this.#current !== undefined && this.#leases.has(this.#current)) return this.#current;
      const held = this.#leases.keys().next();
      if (!held.done) return held.value;
      await abortable(this.#grant(), signal);
    }
  }

  /**
   * Marks `leaseId` as the one carrying the node's presence key: `close()` revokes it only
   * together with every other lease, when none carries a reference (the node holds nothing).
   */
  pin(leaseId: string): void {
    this.#pinned = leaseId;
  }

  /** The lease carrying the node's presence key, if it is still live. */
  get pinned(): string | undefined {
    return this.#pinned !== undefined && this.#leases.has(this.#pinned) ? this.#pinned : undefined;
  }

  /** Forgets `refKey`'s binding (after its reference was deleted). */
  unbind(refKey: string): void {
    const id = this.#bindings.get(refKey);
    if (id === undefined) return;
    this.#bindings.delete(refKey);
    const lease = this.#leases.get(id);
    if (lease) lease.keys--;
  }

  /** Grants the first lease and starts the keepalive loop. */
  async start(signal?: AbortSignal): Promise<void> {
    await abortable(this.#grant(), signal);
    this.#schedule();
  }

  /** Drops `leaseId` and its bindings and reports it lost. No-op if already dropped. */
  lost(leaseId: string, reason: string): void {
    const lease = this.#leases.get(leaseId);
    if (!lease || this.#group.closed) return;
    this.#leases.delete(leaseId);
    this.#updateEarliest();
    for (const [key, id] of this.#bindings) if (id === leaseId) this.#bindings.delete(key);
    if (this.#current === leaseId) this.#current = undefined;
    log.warning("lease {lease} lost ({reason}); granting a new one", { lease: leaseId, reason });
    this.#client.noteError("lease", new Error(`lease ${leaseId} lost: ${reason}`));
    // Replace it now so that the re-created references find a lease waiting. If etcd cannot
    // grant one now (it is down), the keepalive tick retries and reports the loss again once a
    // lease exists: the owner's first re-creation attempt may have failed with etcd.
    this.#grant().catch(() => (this.#replacementPending = true));
    this.#onLost(leaseId, reason);
  }

  /**
   * Asks etcd about each of `ids` and reports those it no longer knows as lost (after a write
   * naming several leases was refused with `lease not found`).
   */
  async verify(ids: Iterable<string>, signal: AbortSignal): Promise<void> {
    for (const id of new Set(ids)) {
      if (!this.#leases.has(id)) continue;
      let ttl: number;
      try {
        const res = await this.#client.call(
          "lease ttl",
          signal,
          (o) => this.#client.raw.lease.leaseTimeToLive({ ID: id }, o),
        );
        ttl = Number(res.TTL);
      } catch (err) {
        if (!(err instanceof LeaseNotFound)) throw err;
        ttl = -1;
      }
      if (!(ttl > 0)) this.lost(id, "lease not found (expired or revoked)");
    }
  }

  /**
   * Renews every lease now and waits (bounded by `signal`) until etcd confirmed each, or a lost
   * one was replaced. A lease whose local deadline already passed is declared lost, not renewed:
   * others may have seen its references vanish.
   */
  async renewNow(signal: AbortSignal): Promise<void> {
    const asked = Date.now();
    await abortable(this.#tick(), signal);
    // Keepalive answers arrive on the stream; a lease counts as renewed once one sent after
    // `asked` was acknowledged (its deadline then lies beyond `asked` + TTL − one interval).
    const renewed = () =>
      this.#leases.size > 0 &&
      [...this.#leases.values()].every((l) => l.expiresAt - l.ttlMs >= asked - 1);
    // Give up after as long as a healthy stream may stay silent; the caller reads the deadline.
    const giveUpAt = asked + 2 * this.#interval() + 1000;
    for (let wait = 5; !renewed() && Date.now() < giveUpAt; wait = Math.min(wait * 2, 100)) {
      if (this.#group.closed) return;
      await sleep(wait, signal);
      if (this.#leases.size === 0 || this.#replacementPending) {
        await abortable(this.#tick(), signal);
      }
    }
  }

  /**
   * Stops renewals and waits for in-flight work. Leases that still carry references lapse on
   * their own (`ttl` after the last renewal, as after a crash); leases that carry none (every
   * key was released, as after `allocate --hold` ends) are revoked at once, so that the node does
   * not look alive to operators for a lease TTL after a clean exit, and its name is free for a new
   * session. The pinned lease (the node's presence key) stays while another lease carries
   * references: the node is live until they lapse. Revoking is best effort.
   * Idempotent: later calls return the first call's promise.
   */
  close(): Promise<void> {
    return this.#group.close(() => {
      if (this.#timer !== undefined) clearTimeout(this.#timer);
      this.#timer = undefined;
      this.#dropStream();
    }, () => this.#revokeEmpty());
  }

  async #revokeEmpty(): Promise<void> {
    const leases = [...this.#leases.values()];
    const holding = leases.some((l) => l.keys > 0);
    const empty = leases.filter((l) => l.keys === 0 && !(holding && l.id === this.#pinned))
      .map((l) => l.id);
    if (empty.length === 0 || this.#client.closed) return;
    await Promise.allSettled(empty.map((id) =>
      this.#client.call(
        "lease revoke",
        undefined,
        (o) => this.#client.raw.lease.leaseRevoke({ ID: id }, o),
        REVOKE_ON_CLOSE_MS,
      ).then(() => this.#leases.delete(id))
    ));
    this.#updateEarliest();
  }

  #withRoom(): string | undefined {
    const cur = this.#current !== undefined ? this.#leases.get(this.#current) : undefined;
    if (cur && cur.keys < MAX_KEYS_PER_LEASE) return cur.id;
    for (const lease of this.#leases.values()) {
      if (lease.keys < MAX_KEYS_PER_LEASE) {
        this.#current = lease.id;
        return lease.id;
      }
    }
    return undefined;
  }

  #bind(refKey: string, leaseId: string): void {
    this.unbind(refKey);
    this.#bindings.set(refKey, leaseId);
    this.#leases.get(leaseId)!.keys++;
  }

  /** One grant in flight at a time; concurrent callers share it. */
  #grant(): Promise<string> {
    if (this.#granting) return this.#granting;
    const signal = this.#group.signal;
    const p = (async () => {
      const sentAt = Date.now();
      const res = await this.#client.call(
        "lease grant",
        signal,
        (o) => this.#client.raw.lease.leaseGrant({ TTL: this.#ttlSec }, o),
      );
      // etcd may raise a TTL below its minimum; renew on what it granted.
      const ttlMs = Math.max(1, Number(res.TTL)) * 1000;
      const id = String(res.ID);
      this.#leases.set(id, { id, ttlMs, keys: 0, expiresAt: sentAt + ttlMs, sent: [] });
      this.#updateEarliest();
      this.#current = id;
      return id;
    })();
    this.#granting = p;
    // Closing waits for it; its callers see its failure.
    this.#group.spawn(p);
    p.catch(() => {}).finally(() => {
      if (this.#granting === p) this.#granting = undefined;
    });
    return p;
  }

  #interval(): number {
    return Math.max(100, Math.floor((this.#ttlSec * 1000) / 3));
  }

  #schedule(): void {
    if (this.#group.closed) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#tick().catch((err) => {
        this.#client.noteError("lease keepalive", err);
        this.#client.telemetry.renewal(err);
      })
        .finally(() => this.#schedule());
    }, this.#interval());
  }

  async #tick(): Promise<void> {
    if (this.#replacementPending) {
      await this.#grant();
      this.#replacementPending = false;
      this.#onLost("", "replacement lease granted after etcd refused one");
    }
    const now = Date.now();
    for (const lease of [...this.#leases.values()]) {
      if (now >= lease.expiresAt) {
        this.lost(lease.id, "no keepalive succeeded before the TTL ran out");
      }
    }
    if (this.#leases.size === 0) return;
    // A stream that stopped answering without an error is replaced.
    if (this.#stream && now - this.#streamSeen > 2 * this.#interval() + 1000) this.#dropStream();
    if (!this.#stream) {
      if (this.#opening === undefined) {
        this.#opening = this.#openStream().finally(() => (this.#opening = undefined));
        // Closing waits for it; this tick's caller sees its failure.
        this.#group.spawn(this.#opening);
      }
      await this.#opening;
    }
    const stream = this.#stream;
    if (!stream) return;
    for (const lease of this.#leases.values()) {
      lease.sent.push(Date.now());
      try {
        stream.write({ ID: lease.id });
      } catch (err) {
        this.#client.noteError("lease keepalive", err);
        this.#dropStream();
        return;
      }
    }
  }

  async #openStream(): Promise<void> {
    const signal = this.#group.signal;
    await this.#client.limiter.take(signal);
    if (signal.aborted) return;
    const stream = await this.#client.raw.lease.leaseKeepAlive() as unknown as KeepAliveStream;
    if (signal.aborted) {
      stream.on("error", () => {});
      closeStream(stream);
      return;
    }
    // Answers of a stream that was replaced cannot be matched to their requests any more.
    stream.on("data", (res: ILeaseKeepAliveResponse) => {
      if (this.#stream === stream) this.#onKeepAlive(res);
    });
    stream.on("error", (err: Error) => {
      if (this.#stream === stream) {
        this.#client.noteError("lease keepalive", err);
        this.#stream = undefined;
      }
    });
    stream.on("end", () => {
      if (this.#stream === stream) this.#stream = undefined;
    });
    // Requests sent on an earlier stream are never answered on this one.
    for (const lease of this.#leases.values()) lease.sent.length = 0;
    this.#stream = stream;
    this.#streamSeen = Date.now();
  }

  #onKeepAlive(res: ILeaseKeepAliveResponse): void {
    const id = String(res.ID);
    const lease = this.#leases.get(id);
    this.#streamSeen = Date.now();
    if (!lease) return;
    const ttl = Number(res.TTL);
    if (!(ttl > 0)) {
      this.lost(id, "lease not found (expired or revoked)");
      return;
    }
    const sentAt = lease.sent.shift();
    if (sentAt === undefined) return;
    this.#client.noteHealthy();
    this.#client.telemetry.renewal();
    lease.expiresAt = Math.max(lease.expiresAt, sentAt + ttl * 1000);
    this.#updateEarliest();
  }

  #dropStream(): void {
    const stream = this.#stream;
    this.#stream = undefined;
    if (stream) closeStream(stream);
  }
}
