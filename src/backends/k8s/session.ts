/**
 * A Kubernetes session: the node's Lease, its reference object, the informer over the identities,
 * the mark keeper and the protocol's writes. Each protocol lives in its own module (`acquire.ts`,
 * `ensure.ts`, `gc.ts`, `watch.ts`, `lease.ts`, `refs.ts`, `heartbeat.ts`); this class wires them to the
 * {@linkcode BackendSession} contract and owns the lifecycle.
 *
 * @example
 * ```ts ignore
 * // ignored: needs an API server (tests/backends/k8s/session.test.ts runs it)
 * const session = await backend.openSession({ leaseTtlMs: 15_000, readOnly: false, onLeaseReplaced });
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
import { errorMessage } from "../../errors.ts";
import { closeSession, writableLease } from "../shared/session_gate.ts";
import { TaskGroup } from "../../task_group.ts";
import { idallocLogger } from "../../log.ts";
import { acquire } from "./acquire.ts";
import type { K8sContext } from "./context.ts";
import { CoordinationNamespaceError } from "./coordination.ts";
import { EndpointUsers } from "./endpoint_informer.ts";
import { ensure } from "./ensure.ts";
import { gcDelete, gcList, gcMark } from "./gc.ts";
import { MarkKeeper } from "./heartbeat.ts";
import type { KubeObject } from "./kube.ts";
import {
  answerOf,
  claimName,
  type IdentityRecord,
  keyProblem,
  readClaim,
  readIdentity,
} from "./layout.ts";
import { LeaseKeeper } from "./lease.ts";
import { RefKeeper } from "./refs.ts";
import { checkLeaseTtl, LEASES } from "./options.ts";
import { IdentityInformer } from "./watch.ts";

const log = idallocLogger("k8s", "gc");

/** What a writable session does with Leases (its node's, the key claims): probed at open. */
const LEASE_VERBS = ["get", "list", "create", "patch", "delete"] as const;

/** The Kubernetes implementation of {@linkcode BackendSession}. */
export class K8sSession implements BackendSession {
  readonly #ctx: K8sContext;
  readonly #readOnly: boolean;
  /** The allocator's GC grace (`SessionOptions.gcGraceMs`), for the GC listing. */
  readonly #gcGraceMs: number | undefined;
  readonly #group = new TaskGroup("Kubernetes session");
  readonly #informer: IdentityInformer;
  readonly #lease: LeaseKeeper | undefined;
  readonly #refs: RefKeeper | undefined;
  readonly #marks: MarkKeeper | undefined;
  readonly #onClose: (session: K8sSession) => void;
  /** Keys this session may hold a reference to (acquired or ensured, and not released since). */
  readonly #referenced = new Set<string>();
  #watchError: string | undefined;
  /** GC's endpoint and slice informers, made by the first GC listing (only GC reads endpoints). */
  #endpoints: EndpointUsers | undefined;
  /** An identity seen recording another coordination namespace (`coordination.ts`). */
  #foreign: number | undefined;

  private constructor(
    ctx: K8sContext,
    options: SessionOptions,
    onClose: (session: K8sSession) => void,
  ) {
    this.#ctx = ctx;
    this.#readOnly = options.readOnly;
    this.#gcGraceMs = options.gcGraceMs;
    this.#onClose = onClose;
    const signal = this.#group.signal;
    if (!options.readOnly) {
      this.#lease = new LeaseKeeper(
        ctx,
        options.leaseTtlMs,
        options.onLeaseReplaced,
        signal,
        () => this.#marks?.sweep(),
      );
      this.#refs = new RefKeeper(ctx, signal);
      this.#marks = new MarkKeeper(
        ctx,
        this.#lease,
        this.#refs,
        () => this.#informer,
        (task) => this.#group.spawn(task),
        signal,
      );
    }
    this.#informer = new IdentityInformer(ctx, {
      onError: (err) => void (this.#watchError = `watch failed: ${errorMessage(err)}`),
      onSuccess: () => void (this.#watchError = undefined),
      onRecord: (record) => {
        if (record.leaseNamespace !== undefined && record.leaseNamespace !== ctx.namespace) {
          this.#foreign ??= record.id;
        }
        this.#marks?.check(record);
      },
    }, signal);
    this.#group.spawn(this.#informer.done);
  }

  /**
   * Opens a session: starts the informer and, unless read-only, checks the rights on the Leases
   * (`StoreAccessDeniedError` naming the rule) and takes the node's Lease (`NodeInUseError` when
   * another process holds it live, unless `restart`; `NamespaceNotFoundError`; `ClockSkewError`).
   * A read-only session reads and writes no Lease.
   */
  static async open(
    ctx: K8sContext,
    options: SessionOptions,
    onClose: (session: K8sSession) => void,
  ): Promise<K8sSession> {
    if (!options.readOnly) checkLeaseTtl(ctx.settings, options.leaseTtlMs);
    const session = new K8sSession(ctx, options, onClose);
    if (session.#lease !== undefined) {
      try {
        // A read-only session needs no right on the Leases; a writable one names them all at once.
        await ctx.client.probe([
          { resource: LEASES, verbs: LEASE_VERBS, namespace: ctx.namespace },
        ], {
          timeoutMs: ctx.settings.connectTimeoutMs,
          ...(options.signal === undefined ? {} : { signal: options.signal }),
        });
        const bound = session.#group.bound(options.signal);
        await session.#lease.start(options.restart === true, bound);
        await session.#refs!.start(bound);
      } catch (err) {
        await session.close();
        throw err;
      }
    }
    return session;
  }

  /** The node's lease keeper (undefined for read-only sessions); for tests. */
  get lease(): LeaseKeeper | undefined {
    return this.#lease;
  }

  /** The informer (its index is the protocol's view of the identities); for tests. */
  get informer(): IdentityInformer {
    return this.#informer;
  }

  /** The node's reference object's writer (undefined for read-only sessions); for tests. */
  get refs(): RefKeeper | undefined {
    return this.#refs;
  }

  /** GC's endpoint and slice informers, once a GC listing made them; for tests. */
  get endpoints(): EndpointUsers | undefined {
    return this.#endpoints;
  }

  /** Cilium GC marks this session removed from identities it holds; for tests. */
  get unmarked(): number {
    return this.#marks?.unmarked ?? 0;
  }

  async acquire(request: AcquireRequest): Promise<AcquireResult> {
    const lease = this.#writable("acquire");
    await this.#coordinated(request.signal);
    // Before the call: a failed acquire may still have written its reference.
    this.#referenced.add(request.key);
    return await acquire(
      { ctx: this.#ctx, lease, informer: this.#informer, refs: this.#refs! },
      { ...request, signal: this.#group.bound(request.signal) },
    );
  }

  /**
   * Drops this node's references for `key`: to `id` and to every identity of the key the index
   * shows, in one write of the node's reference object; an ID another key of this node is held on
   * stays referenced (`refs.ts`).
   */
  async release(key: string, id: number, signal: AbortSignal): Promise<void> {
    this.#writable("release");
    const bound = this.#group.bound(signal);
    const ids = new Set(this.#informer.index.ofKey(key).map((r) => r.id));
    if (id > 0) ids.add(id);
    await this.#refs!.drop(key, ids, bound);
    this.#referenced.delete(key);
  }

  async ensure(held: readonly HeldKey[], signal: AbortSignal): Promise<EnsureReport[]> {
    const lease = this.#writable("ensure");
    await this.#coordinated(signal);
    for (const { key } of held) this.#referenced.add(key);
    return await ensure(
      {
        ctx: this.#ctx,
        lease,
        informer: this.#informer,
        refs: this.#refs!,
        fresh: () => this.#watchError === undefined,
        referenced: this.#referenced,
      },
      held,
      this.#group.bound(signal),
    );
  }

  /**
   * Cilium's answer for `key` among the identities the store shows carrying it: those the index
   * knows of and the one the key's claim names, each read (in parallel) to confirm it. An
   * identity that a Cilium node created a moment ago and the watch has not shown yet is not
   * seen (Cilium's own `Get` reads the same watch cache). A read-only session reads no claim (its
   * user may have no right on Leases): it answers from the informer's list once synced.
   */
  async get(key: string, signal: AbortSignal): Promise<number | undefined> {
    this.#open();
    if (keyProblem(key) !== undefined) return undefined;
    const bound = this.#group.bound(signal);
    const { client, identities, namespace, resourceName } = this.#ctx;
    const read = (id: number) => client.get(identities, String(id), { signal: bound });
    // A read-only session reads no Lease (its user may have no right to): it waits for the
    // informer's list instead of asking the key's claim for an identity not shown yet.
    if (this.#readOnly) await this.#informer.waitSynced(bound);
    const known = this.#informer.index.ofKey(key).map((r) => r.id);
    const [claimObj, ...objs] = await Promise.all([
      this.#readOnly
        ? undefined
        : client.get(LEASES, claimName(resourceName, key), { namespace, signal: bound }),
      ...known.map(read),
    ]);
    const claim = claimObj === undefined ? undefined : readClaim(claimObj);
    if (claim !== undefined && claim.key === key && !known.includes(claim.id)) {
      objs.push(await read(claim.id));
    }
    const carrying = objs
      .filter((o): o is KubeObject => o !== undefined)
      .map(readIdentity)
      .flatMap((r) => (r.ok && r.record.key === key ? [r.record] : []));
    return answerOf(carrying)?.id;
  }

  async getById(id: number, signal: AbortSignal): Promise<string | undefined> {
    this.#open();
    if (!Number.isSafeInteger(id) || id <= 0) return undefined;
    const { client, identities } = this.#ctx;
    const obj = await client.get(identities, String(id), { signal: this.#group.bound(signal) });
    if (obj === undefined) return undefined;
    const read = readIdentity(obj);
    return read.ok ? read.record.key : undefined;
  }

  watch(signal: AbortSignal): AsyncIterable<BackendEvent> {
    this.#open();
    return this.#informer.subscribe(this.#group.bound(signal));
  }

  gcList(
    range: { min: number; max: number },
    signal: AbortSignal,
    options?: GcListOptions,
  ): AsyncIterable<GcCandidate> {
    this.#open();
    this.#endpoints ??= new EndpointUsers(
      this.#ctx,
      this.#group.signal,
      (task) => this.#group.spawn(task),
    );
    return gcList(this.#ctx, range, this.#group.bound(signal), {
      ...options,
      sweep: !this.#readOnly,
      endpoints: this.#endpoints,
      ...(this.#gcGraceMs === undefined ? {} : { graceMs: this.#gcGraceMs }),
    });
  }

  /** See {@linkcode BackendSession.gcMark}: Cilium's `io.cilium.heartbeat`, guarded. */
  async gcMark(candidate: GcCandidate, signal: AbortSignal): Promise<string | undefined> {
    this.#writable("gcMark");
    return await gcMark(this.#ctx, candidate, this.#group.bound(signal));
  }

  /**
   * See {@linkcode BackendSession.gcDelete}. An endpoint the endpoint informers show naming the ID
   * now keeps it, though the pass listed it unused: a Cilium agent removes the mark only when its
   * own cache shows it (`AcquireReference`), so an agent whose watch lagged the mark can write its
   * endpoint after the pass read the users and before the delete (the mixed nemesis, seed 42: 208
   * ms before). This narrows that window from the pass's length to the informer's lag; Cilium's
   * operator keeps the whole window.
   */
  async gcDelete(candidate: GcCandidate, signal: AbortSignal): Promise<boolean> {
    this.#writable("gcDelete");
    if (!candidate.inUse && this.#endpoints?.namesNow(candidate.id)) {
      log.info("identity {id} is named by an endpoint written since the GC pass read them: kept", {
        id: candidate.id,
      });
      return false;
    }
    return await gcDelete(this.#ctx, candidate, this.#group.bound(signal));
  }

  claimValidUntil(): number {
    return this.#lease ? this.#lease.claimValidUntil : Infinity;
  }

  async renew(signal: AbortSignal): Promise<void> {
    const lease = this.#writable("renew");
    signal.throwIfAborted();
    await lease.renewNow();
    this.#marks?.sweep();
  }

  status(): SessionStatus {
    const lastError = this.#lease?.lastError ?? this.#watchError ??
      (Date.now() >= this.claimValidUntil() ? "lease lapsed: not renewed in time" : undefined);
    return {
      backend: "k8s",
      node: this.#ctx.node,
      endpoints: [this.#ctx.client.server],
      leases: this.#lease && !this.#group.closed ? 1 : 0,
      leaseExpiresAt: this.#lease?.expiresAt,
      lastError,
      healthy: !this.#group.closed && lastError === undefined,
    };
  }

  /**
   * Stops the lease's renewals, the informer and the mark keeper, and waits for them. A session
   * that holds no reference any more also deletes its node's Lease, so that its node name is free
   * at once (as an etcd session revokes its lease); otherwise the Lease lapses with its
   * references. Idempotent.
   */
  close(): Promise<void> {
    const lease = this.#lease;
    const refs = this.#refs;
    return closeSession(this.#group, {
      lease: lease && {
        close: async (release?: boolean) => {
          // Nothing referenced: the reference object goes with the Lease.
          if (release) await refs?.removeIfEmpty(AbortSignal.timeout(2_000));
          await lease.close(release);
        },
      },
      release: this.#referenced.size === 0,
      after: () => this.#onClose(this),
    });
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #open(): void {
    this.#group.throwIfClosed();
  }

  /**
   * Waits for the informer's list, then throws {@linkcode CoordinationNamespaceError} if an
   * identity records another coordination namespace than this node's (and still does).
   */
  async #coordinated(signal: AbortSignal | undefined): Promise<void> {
    await this.#informer.waitSynced(this.#group.bound(signal));
    if (this.#foreign === undefined) return;
    const { index } = this.#informer;
    const foreign = (r: IdentityRecord | undefined): r is IdentityRecord =>
      r?.leaseNamespace !== undefined && r.leaseNamespace !== this.#ctx.namespace;
    let record = index.get(this.#foreign);
    // Relabelled or gone since: look once for another before letting the node write.
    if (!foreign(record)) record = [...index.records()].find(foreign);
    this.#foreign = record?.id;
    if (record === undefined) return;
    throw new CoordinationNamespaceError(
      this.#ctx.namespace,
      record.leaseNamespace!,
      String(record.id),
    );
  }

  #writable(operation: string): LeaseKeeper {
    return writableLease(this.#group, this.#lease, operation);
  }
}
