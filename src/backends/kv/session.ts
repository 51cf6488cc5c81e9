/**
 * A Deno KV session: the node's lease, its writes and its watches. Each protocol lives in its own
 * module (`acquire.ts`, `ensure.ts`, `gc.ts`, `watch.ts`, `lease.ts`); this class wires them to the
 * {@linkcode BackendSession} contract and owns the lifecycle.
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
import { errorMessage, InvalidOptionsError } from "../../errors.ts";
import { closeSession, writableLease } from "../shared/session_gate.ts";
import { newerOrderedVersion } from "../shared/versions.ts";
import { TaskGroup } from "../../task_group.ts";
import { acquire } from "./acquire.ts";
import { CommitBatcher } from "./batch.ts";
import { ensure } from "./ensure.ts";
import { watchMasters } from "./watch.ts";
import { gcDelete, gcList } from "./gc.ts";
import { get, type KvStats, newStats } from "./client.ts";
import type { KvContext } from "./context.ts";
import { LeaseKeeper } from "./lease.ts";
import { decode } from "./schema.ts";

/** The Deno KV implementation of {@linkcode BackendSession}. */
export class DenoKvSession implements BackendSession {
  /** Round trips of the caller-driven operations (acquire, release, ensure, get, GC). */
  readonly stats: KvStats;
  /** Round trips of the background work (lease renewal, watches). */
  readonly backgroundStats: KvStats;
  readonly #ctx: KvContext;
  readonly #readOnly: boolean;
  /** The closing signal, the watches' background tasks and the idempotent close. */
  readonly #group = new TaskGroup("Deno KV session");
  readonly #batcher: CommitBatcher;
  #lease: LeaseKeeper | undefined;
  #watchError: string | undefined;
  /**
   * Keys this session may hold a reference to: added before any write of one, removed only once
   * its release landed. Never smaller than the truth, so a session that closes with it empty
   * holds nothing and may delete its lease record.
   */
  readonly #referenced = new Set<string>();

  private constructor(ctx: KvContext, readOnly: boolean) {
    this.#ctx = ctx;
    this.stats = newStats(ctx.telemetry);
    this.backgroundStats = newStats(ctx.telemetry);
    this.#readOnly = readOnly;
    this.#batcher = new CommitBatcher(
      ctx,
      this.stats,
      this.#group.signal,
      ctx.settings.groupCommit,
    );
  }

  /**
   * Opens a session: validates `options` and, unless read-only, claims the node's lease record
   * (throws {@linkcode NodeInUseError} while another session's lease in it is live, unless
   * `options.restart`).
   */
  static async open(ctx: KvContext, options: SessionOptions): Promise<DenoKvSession> {
    const session = new DenoKvSession(ctx, options.readOnly);
    if (!options.readOnly) {
      const ttl = options.leaseTtlMs;
      const skew = ctx.settings.maxClockSkewMs;
      if (!Number.isSafeInteger(ttl) || ttl < 2 * skew || ttl <= 0) {
        throw new InvalidOptionsError(
          `Cannot open Deno KV session as 'leaseTtlMs' must be a positive integer of at least ` +
            `2 × maxClockSkewMs (${2 * skew}): current value is ${ttl}`,
        );
      }
      const lease = new LeaseKeeper(
        ctx,
        session.backgroundStats,
        ttl,
        options.onLeaseReplaced,
        session.#group.signal,
      );
      await lease.start(options.signal ?? session.#group.signal, options.restart ?? false);
      session.#lease = lease;
    }
    return session;
  }

  /** The lease keeper (undefined for read-only sessions); for tests. */
  get lease(): LeaseKeeper | undefined {
    return this.#lease;
  }

  async acquire(request: AcquireRequest): Promise<AcquireResult> {
    const lease = this.#writable("acquire");
    const tally = request.roundTrips;
    // The call's own counter (charging the session's too) tells its round trips.
    const stats = tally ? newStats(undefined, this.stats) : this.stats;
    this.#referenced.add(request.key);
    try {
      return await acquire(this.#ctx, stats, lease, this.#batcher, request);
    } finally {
      if (tally) tally.count += stats.reads + stats.lists + stats.commits;
    }
  }

  async release(key: string, _id: number, signal: AbortSignal): Promise<void> {
    this.#writable("release");
    const ref = this.#ctx.layout.ref(key, this.#ctx.settings.node);
    // Through the batcher: concurrent releases share one commit (a delete has no check to fail).
    await this.#batcher.commit({
      checks: [],
      mutations: [{ type: "delete", key: ref }],
      changes: [],
    }, signal);
    this.#referenced.delete(key);
  }

  /** Group commit of acquisitions and releases (counters for tests and benchmarks). */
  get batcher(): CommitBatcher {
    return this.#batcher;
  }

  async ensure(held: readonly HeldKey[], signal: AbortSignal): Promise<EnsureReport[]> {
    for (const { key } of held) this.#referenced.add(key);
    return await ensure(this.#ctx, this.stats, this.#writable("ensure"), held, signal);
  }

  async get(key: string, signal: AbortSignal): Promise<number | undefined> {
    this.#open();
    const { layout } = this.#ctx;
    // No entry of a key this large can exist (the store could not even read its index).
    if (!layout.fitsKey(key)) return undefined;
    const index = await get(this.#ctx, this.stats, layout.key(key), signal);
    if (index.versionstamp === null) return undefined;
    const id = decode.keyIndex(index as Deno.KvEntry<unknown>)?.id;
    if (id === undefined) return undefined;
    return await this.getById(id, signal) === key ? id : undefined;
  }

  async getById(id: number, signal: AbortSignal): Promise<string | undefined> {
    this.#open();
    const master = await get(this.#ctx, this.stats, this.#ctx.layout.id(id), signal);
    if (master.versionstamp === null) return undefined;
    return decode.master(master as Deno.KvEntry<unknown>)?.key;
  }

  watch(signal: AbortSignal): AsyncIterable<BackendEvent> {
    this.#open();
    return watchMasters(this.#ctx, this.backgroundStats, this.#group.bound(signal), {
      onError: (err) => {
        this.#ctx.telemetry?.reconnect(err);
        this.#watchError = `watch failed: ${errorMessage(err)}`;
      },
      onSuccess: () => {
        this.#watchError = undefined;
      },
      track: (task) => this.#group.spawn(task),
    });
  }

  gcList(
    range: { min: number; max: number },
    signal: AbortSignal,
    options?: GcListOptions,
  ): AsyncIterable<GcCandidate> {
    this.#open();
    // A read-only session lists without sweeping: it must not write.
    return gcList(this.#ctx, this.stats, range, signal, {
      ...options,
      sweep: this.#lease !== undefined,
    });
  }

  async gcDelete(candidate: GcCandidate, signal: AbortSignal): Promise<boolean> {
    this.#writable("gcDelete");
    return await gcDelete(this.#ctx, this.stats, candidate, signal);
  }

  /** See {@linkcode BackendSession.newerVersion}: versionstamps are ordered. */
  newerVersion(a: string, b: string): boolean {
    return newerOrderedVersion(a, b);
  }

  claimValidUntil(): number {
    return this.#lease ? this.#lease.claimValidUntil : Infinity;
  }

  async renew(signal: AbortSignal): Promise<void> {
    const lease = this.#writable("renew");
    signal.throwIfAborted();
    await lease.renewNow();
  }

  status(): SessionStatus {
    const lastError = this.#lease?.lastError ?? this.#watchError ??
      (Date.now() >= this.claimValidUntil() ? "lease lapsed: not renewed in time" : undefined);
    return {
      backend: "deno-kv",
      node: this.#ctx.settings.node,
      endpoints: ["deno-kv"],
      leases: this.#lease && !this.#group.closed ? 1 : 0,
      leaseExpiresAt: this.#lease?.expiresAt,
      lastError,
      healthy: !this.#group.closed && lastError === undefined,
    };
  }

  /**
   * Stops the lease's renewals and the watches, and waits for them. A session that holds no
   * reference any more also deletes its lease record, so that its node name is free at once;
   * otherwise the record lapses with its references. Idempotent.
   */
  close(): Promise<void> {
    // The lease's renewals are not the group's tasks: stop them, and wait for one in flight.
    return closeSession(this.#group, { lease: this.#lease, release: this.#referenced.size === 0 });
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }

  #open(): void {
    this.#group.throwIfClosed();
  }

  #writable(operation: string): LeaseKeeper {
    return writableLease(this.#group, this.#lease, operation);
  }
}
