/**
 * The etcd implementation of {@linkcode BackendSession}: the node's leases, the guarded
 * transactions, the list-and-watch, GC support and status.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a running etcd (tests/conformance/session.test.ts runs the session contract)
 * const session = await backend.openSession({ leaseTtlMs: 60_000, readOnly: false, onLeaseReplaced });
 * console.log(session.status());
 * await session.close();
 * ```
 *
 * @module
 */
import type {
  AcquireRequest,
  AcquireResult,
  BackendEvent,
  BackendSession,
  EnsureReport,
  GcCandidate,
  GcListOptions,
  HeldKey,
  SessionOptions,
  SessionStatus,
} from "../../allocator/backend.ts";
import { ConflictError } from "../../errors.ts";
import { closeSession, writableLease } from "../shared/session_gate.ts";
import { newerOrderedVersion } from "../shared/versions.ts";
import { TaskGroup } from "../../task_group.ts";
import { idallocLogger } from "../../log.ts";
import { acquire, idOfReferences } from "./acquire.ts";
import { bytes, type EtcdClient, LeaseNotFound } from "./client.ts";
import type { EtcdContext } from "./context.ts";
import { ensure } from "./ensure.ts";
import { gcDelete, gcList } from "./gc.ts";
import { LeaseManager } from "./lease.ts";
import { claimNode } from "./presence.ts";
import type { EtcdLayout } from "./layout.ts";
import { del, prefixRange, snapshotOf, text } from "./txn.ts";
import { watchMasters } from "./watch.ts";
import { TxnBatcher } from "./batch.ts";

const log = idallocLogger("etcd");

/** The shortest lease etcd is asked for, in seconds (Cilium's minimum is larger still). */
export const MIN_LEASE_TTL_SEC = 2;
/** How stale the leader in `status()` may get before a background refresh is started. */
const STATUS_REFRESH_MS = 5_000;

/** Lease TTL in whole seconds for a requested TTL in ms: rounded up, at least 2 s. */
export function leaseTtlSeconds(ms: number): number {
  return Math.max(MIN_LEASE_TTL_SEC, Math.ceil(ms / 1000));
}

/** A lease that vanished twice in one call surfaces as a retryable conflict. */
async function retryableLeaseLoss<T>(p: Promise<T>): Promise<T> {
  try {
    return await p;
  } catch (err) {
    if (err instanceof LeaseNotFound) {
      throw new ConflictError("the node's lease vanished during the call; retry", { cause: err });
    }
    throw err;
  }
}

/**
 * What the session needs from its backend (the parts of the session share an
 * {@linkcode EtcdContext} built from it).
 */
export interface SessionWiring {
  readonly client: EtcdClient;
  readonly layout: EtcdLayout;
  readonly node: string;
  readonly endpoints: readonly string[];
  /** Whether writes honour Cilium's mutexes (see `EtcdBackendOptions.honorCiliumLocks`). */
  readonly ciliumLocks: boolean;
  /** Whether concurrent writes share requests (see `EtcdBackendOptions.groupCommit`). */
  readonly groupCommit: boolean;
  /** Called when the session closes, so that the backend forgets it. */
  readonly onClose: (session: EtcdSession) => void;
}

/** One allocator's live connection to etcd. */
export class EtcdSession implements BackendSession {
  readonly #wiring: SessionWiring;
  readonly #ctx: EtcdContext;
  readonly #readOnly: boolean;
  /** The closing signal, the status refreshes in flight and the idempotent close. */
  readonly #group = new TaskGroup("etcd session");
  #leader: string | undefined;
  #statusAt = 0;
  /** Whether the node's presence key was claimed (a writable session that opened). */
  #claimed = false;
  #reclaiming: Promise<void> | undefined;

  private constructor(wiring: SessionWiring, options: SessionOptions) {
    this.#wiring = wiring;
    this.#readOnly = options.readOnly;
    const leases = new LeaseManager(
      wiring.client,
      leaseTtlSeconds(options.leaseTtlMs),
      () => {
        // The node's presence key went with its lease: put it on a live one again.
        if (this.#claimed && leases.pinned === undefined) this.#reclaimNode();
        try {
          options.onLeaseReplaced();
        } catch (err) {
          log.error("onLeaseReplaced failed: {err}", { err });
        }
      },
    );
    this.#ctx = {
      client: wiring.client,
      layout: wiring.layout,
      node: wiring.node,
      leases,
      ciliumLocks: wiring.ciliumLocks,
      txns: new TxnBatcher(wiring.client, this.#group.signal, wiring.groupCommit),
    };
  }

  /**
   * Opens a session: unless read-only, grants the first lease, starts renewing it and claims the
   * node's name on it (`presence.ts`): while another session holds the name, throws
   * {@linkcode NodeInUseError} (unless `options.restart`) and leaves nothing behind. The claim is
   * also the first write: a user etcd does not let write under the prefix is refused here
   * ({@linkcode StoreAccessDeniedError}), not at the first allocation.
   */
  static async open(wiring: SessionWiring, options: SessionOptions): Promise<EtcdSession> {
    wiring.client.assertOpen();
    const session = new EtcdSession(wiring, options);
    if (!options.readOnly) {
      const { leases } = session.#ctx;
      try {
        const signal = session.#group.bound(options.signal);
        await leases.start(signal);
        const lease = await leases.anyLease(signal);
        await claimNode(wiring.client, wiring.layout, wiring.node, lease, {
          restart: options.restart ?? false,
          signal,
        });
        leases.pin(lease);
        session.#claimed = true;
      } catch (err) {
        // Revokes the unused lease: nothing of this session stays behind.
        await leases.close();
        throw err;
      }
    }
    session.#refreshStatus();
    return session;
  }

  /**
   * Puts the node's presence key on a live lease again after its lease was lost (a stall past
   * the TTL, a revoke). Another session may have taken the name meanwhile (it judged this node
   * dead): then this one says so in `status().lastError` and does not fight for it.
   */
  #reclaimNode(): void {
    if (this.#reclaiming || this.#group.closed) return;
    const { client, leases } = this.#ctx;
    const signal = this.#group.signal;
    this.#reclaiming = (async () => {
      const lease = await leases.anyLease(signal);
      await claimNode(client, this.#wiring.layout, this.#wiring.node, lease, {
        restart: false,
        signal,
      });
      leases.pin(lease);
    })().finally(() => (this.#reclaiming = undefined));
    this.#group.spawn(this.#reclaiming, (err) => {
      log.warning("re-claiming node name {node} failed: {err}", { node: this.#wiring.node, err });
      client.noteError("claim node", err);
    });
  }

  #signal(signal: AbortSignal): AbortSignal {
    return this.#group.bound(signal);
  }

  #assertOpen(): void {
    this.#group.throwIfClosed();
    this.#wiring.client.assertOpen();
  }

  #assertWritable(operation: string): void {
    this.#assertOpen();
    writableLease(this.#group, this.#readOnly ? undefined : this.#ctx.leases, operation);
  }

  /** See {@linkcode BackendSession.acquire}. */
  async acquire(request: AcquireRequest): Promise<AcquireResult> {
    this.#assertWritable("acquire");
    return await retryableLeaseLoss(
      acquire(this.#ctx, { ...request, signal: this.#signal(request.signal) }),
    );
  }

  /** See {@linkcode BackendSession.release}. */
  async release(key: string, _id: number, signal: AbortSignal): Promise<void> {
    this.#assertWritable("release");
    const { layout, leases, node } = this.#ctx;
    const refKey = layout.refKey(key, node);
    // A transaction, not a plain delete, so that concurrent releases share one request.
    await this.#ctx.txns.run(
      "release",
      { compare: [], success: [del(refKey)], failure: [] },
      this.#signal(signal),
    );
    leases.unbind(refKey);
  }

  /** See {@linkcode BackendSession.ensure}. */
  async ensure(held: readonly HeldKey[], signal: AbortSignal): Promise<EnsureReport[]> {
    this.#assertWritable("ensure");
    return await retryableLeaseLoss(ensure(this.#ctx, held, this.#signal(signal)));
  }

  /** See {@linkcode BackendSession.get}. */
  async get(key: string, signal: AbortSignal): Promise<number | undefined> {
    this.#assertOpen();
    const { client, layout } = this.#ctx;
    const refPrefix = layout.refPrefix(key);
    const res = await client.call(
      "get",
      this.#signal(signal),
      (o) => client.raw.kv.range({ ...prefixRange(refPrefix + "/") }, o),
    );
    // The ID the key's well-formed references on a lease agree on (a reference without a lease is
    // garbage and never answers for the key); for a split key, its newest master among theirs.
    const snapshot = snapshotOf(refPrefix, res.kvs, String(res.header.revision));
    return await idOfReferences(this.#ctx, snapshot, key, this.#signal(signal));
  }

  /** See {@linkcode BackendSession.getById}. */
  async getById(id: number, signal: AbortSignal): Promise<string | undefined> {
    this.#assertOpen();
    const { client, layout } = this.#ctx;
    const res = await client.call(
      "get by id",
      this.#signal(signal),
      (o) => client.raw.kv.range({ key: bytes(layout.masterKey(id)) }, o),
    );
    const value = res.kvs[0] ? text(res.kvs[0].value) : "";
    return value === "" ? undefined : value;
  }

  /** See {@linkcode BackendSession.watch}. */
  async *watch(signal: AbortSignal): AsyncGenerator<BackendEvent> {
    this.#assertOpen();
    yield* watchMasters(this.#ctx, this.#signal(signal));
  }

  /** See {@linkcode BackendSession.gcList}. */
  async *gcList(
    range: { min: number; max: number },
    signal: AbortSignal,
    options?: GcListOptions,
  ): AsyncGenerator<GcCandidate> {
    this.#assertOpen();
    yield* gcList(this.#ctx, range, this.#signal(signal), options);
  }

  /** See {@linkcode BackendSession.gcDelete}. */
  async gcDelete(candidate: GcCandidate, signal: AbortSignal): Promise<boolean> {
    this.#assertWritable("gcDelete");
    return await gcDelete(this.#ctx, candidate, this.#signal(signal));
  }

  /** See {@linkcode BackendSession.newerVersion}: mod revisions are ordered. */
  newerVersion(a: string, b: string): boolean {
    return newerOrderedVersion(a, b);
  }

  /** See {@linkcode BackendSession.claimValidUntil}: the earliest local deadline of a lease. */
  claimValidUntil(): number {
    if (this.#readOnly) return Infinity;
    return this.#ctx.leases.expiresAt ?? 0;
  }

  /** See {@linkcode BackendSession.renew}. */
  async renew(signal: AbortSignal): Promise<void> {
    this.#assertWritable("renew");
    await this.#ctx.leases.renewNow(this.#signal(signal));
  }

  /** See {@linkcode BackendSession.status}. Starts a background refresh of the leader if stale. */
  status(): SessionStatus {
    const { client, leases } = this.#ctx;
    this.#refreshStatus();
    return {
      backend: "etcd",
      node: this.#wiring.node,
      endpoints: [...this.#wiring.endpoints],
      leader: this.#leader,
      leases: leases.count,
      leaseExpiresAt: leases.expiresAt,
      lastError: client.lastError,
      healthy: client.healthy && !client.closed && !this.#group.closed &&
        Date.now() < this.claimValidUntil(),
    };
  }

  #refreshStatus(): void {
    if (this.#group.closed || this.#wiring.client.closed) return;
    if (Date.now() - this.#statusAt < STATUS_REFRESH_MS) return;
    this.#statusAt = Date.now();
    const { client } = this.#ctx;
    const task = (async () => {
      const s = await client.call(
        "status",
        this.#group.signal,
        (o) => client.raw.maintenance.status(o),
      );
      const leaderId = String(s.leader);
      let name = leaderId;
      try {
        const members = await client.call(
          "member list",
          this.#group.signal,
          (o) => client.raw.cluster.memberList({}, o),
        );
        const m = members.members.find((x) => String(x.ID) === leaderId);
        if (m?.name) name = `${m.name} (${leaderId})`;
      } catch {
        // The ID alone will do.
      }
      this.#leader = name;
    })();
    // A refresh stopped by the closing signal is no connection trouble worth reporting.
    this.#group.spawn(task, (err) => client.noteError("status", err));
  }

  /** See {@linkcode BackendSession.close}. Idempotent. */
  close(): Promise<void> {
    // The lease manager revokes on its own the leases that carry no reference.
    return closeSession(this.#group, {
      lease: this.#ctx.leases,
      after: () => this.#wiring.onClose(this),
    });
  }

  /** Same as {@linkcode EtcdSession.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
