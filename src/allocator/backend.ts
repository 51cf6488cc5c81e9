/**
 * The contract between the backend-agnostic allocator core and a store (Deno KV, etcd, …).
 *
 * A {@linkcode Backend} is configuration plus, for etcd, a connection. It holds no timers. The
 * allocator calls {@linkcode Backend.openSession} once; the returned {@linkcode BackendSession}
 * owns everything with a lifecycle (the node's lease and its renewal, watches) and is closed by the
 * allocator's `close()`.
 *
 * Words (see `docs/data-layout.md`):
 * - **master**: the record of an ID (`id/<N>` → key). Created only if absent, never rewritten to
 *   another key, deleted only by GC (guarded) or by an operator.
 * - **reference**: one node's claim on a key (`value/<key>/<node>` → N), bound to the node's lease.
 * - **live ID**: a master with at least one reference whose lease is alive.
 *
 * Every write a session makes is guarded by the store's own atomic check; the allocator's cache is
 * only ever a hint.
 *
 * @example A backend is handed to the allocator, which opens and closes the session
 * ```ts
 * import assert from "node:assert/strict";
 * import { Allocator, DenoKvBackend } from "@idalloc/idalloc";
 * using kv = await Deno.openKv(":memory:");
 * const backend = new DenoKvBackend(kv, { prefix: ["ids"], node: "a" });
 * await using alloc = await Allocator.open(backend, { max: 1000 });
 * assert.equal(alloc.backend, backend);
 * ```
 *
 * @module
 */
import type { GcSkip } from "./damage.ts";
import type { BackendAdmin } from "./admin.ts";
import type { IdRange } from "./id_space.ts";

export type { BackendAdmin, NodeLease, SplitKey, StoredReference } from "./admin.ts";
export type { IdRange } from "./id_space.ts";

/** One change of the store's ID ↔ key mappings, as a backend's watch reports it. */
export type BackendEvent =
  | {
    /** A master was created or (re)listed. */
    type: "upsert";
    /** The ID (with any prefix mask, as stored). */
    id: number;
    /** The encoded key the master maps to. */
    key: string;
    /**
     * Opaque version of the master (Deno KV: its versionstamp; etcd: its mod revision), passed
     * back as {@linkcode AcquireRequest.hint} so that acquiring an existing key can skip a read.
     */
    version: string;
    /** When the change happened (ms since the epoch), for the watch-lag metric; see `delete`. */
    at?: number;
  }
  | {
    /** A master vanished (deleted, or missing from a re-list). */
    type: "delete";
    /** The ID whose master is gone. */
    id: number;
    /**
     * When the change happened (ms since the epoch), if the backend can tell: the writer's clock
     * (Deno KV's change feed), or when the store's notification arrived (etcd). Absent for what a
     * (re)list found.
     */
    at?: number;
  }
  | {
    /** The initial list is complete; sent once per watch. */
    type: "synced";
  };

/** What the allocator asks of {@linkcode BackendSession.acquire}. */
export interface AcquireRequest {
  /** The encoded key, already checked by {@linkcode Backend.checkKey}. */
  readonly key: string;
  /**
   * The cache's idea of the key's master, if it has one. Only a hint: the session must guard the
   * write by the store's atomic check and fall back to reading the store when the hint is stale.
   */
  readonly hint?: { readonly id: number; readonly version: string };
  /**
   * Picks a free ID (prefix mask applied) for a new master, never one in `exclude`. Returns
   * `undefined` when the pool is exhausted. The same key yields the same first candidate on every
   * node with the same cache, so racing nodes collide on one ID instead of burning two.
   */
  readonly pickCandidate: (exclude: ReadonlySet<number>) => number | undefined;
  /**
   * The stored IDs (prefix mask applied) this allocator may hand out. An ID outside it, found in
   * the store (a reference or an index written by someone else), never becomes the key's ID. When
   * absent, any positive safe integer is accepted.
   */
  readonly range?: IdRange;
  /** Aborts the attempt; the session rejects with `signal.reason`. */
  readonly signal: AbortSignal;
  /**
   * Telemetry: the session adds one for every store round trip it makes for this request (a
   * shared group commit counts once), whether the call succeeds or not.
   */
  readonly roundTrips?: { count: number };
  /**
   * What earlier attempts of the same allocation left: one object for every attempt of one
   * `allocate` (see {@linkcode AttemptTrail}). Absent for a lone call.
   */
  readonly trail?: AttemptTrail;
}

/**
 * Kept across the attempts of one allocation so that the master an attempt created is reported
 * created (Cilium's `isNew`) exactly once, even when that attempt failed after its create landed:
 * a later step failed, or the store's answer to the create was lost. Without it the next attempt
 * finds the master, joins it, and no node reports the key new.
 *
 * A session writes `created` as soon as it knows its write created a master, and `unconfirmed`
 * just before it sends a write that creates one, clearing it when the answer arrives. An attempt
 * that finds `unconfirmed` set first asks the store whether that write landed, by a mark only
 * that write leaves (each backend's `acquire.ts` says which), and records `created` if it did.
 */
export interface AttemptTrail {
  /** The ID whose master an attempt of this allocation created. */
  created?: number;
  /**
   * A create of master `id` whose answer never arrived (it may have landed), with what else the
   * backend needs to recognise its own write (`mark`: opaque to the core).
   */
  unconfirmed?: { readonly id: number; readonly mark?: string };
}

/** The result of a successful {@linkcode BackendSession.acquire}. */
export interface AcquireResult {
  /** The key's ID. */
  readonly id: number;
  /** True when this call created the master (Cilium's `isNew`). */
  readonly created: boolean;
  /** The master's version, when known (for the cache). */
  readonly version?: string;
}

/** A key this node holds and the ID it holds it with (used by sync and master-key protection). */
export interface HeldKey {
  /** The encoded key. */
  readonly key: string;
  /** The ID held. */
  readonly id: number;
}

/** What {@linkcode BackendSession.ensure} found and did for one held key. */
export interface EnsureReport {
  /** The encoded key. */
  readonly key: string;
  /** The ID held. */
  readonly id: number;
  /**
   * `ok`: the master maps `id` → `key`. `recreated`: it was missing and was written again.
   * `conflict`: the master or the key now belongs to something else; nothing was written (the
   * allocator re-acquires the key under a new ID). `busy`: another writer holds a lock on the key
   * or the ID (a Cilium mutex); nothing was written and the allocator tries again later.
   */
  readonly master: "ok" | "recreated" | "conflict" | "busy";
  /** `ok`: this node's live reference exists. `recreated`: it was missing or dead and was written. */
  readonly reference: "ok" | "recreated" | "skipped";
}

/** One master as seen by a GC pass. */
export interface GcCandidate {
  /** The ID (as stored). */
  readonly id: number;
  /** The encoded key of the master. */
  readonly key: string;
  /**
   * Opaque version that changes whenever the master is rewritten **or any node acquires a
   * reference to the key** (Deno KV: master versionstamp + the key's touch counter; etcd: master
   * mod revision plus the newest reference revision). Two passes seeing the same version and no
   * live reference make the ID collectable.
   */
  readonly version: string;
  /** Whether at least one reference with a live lease exists right now. */
  readonly inUse: boolean;
  /**
   * When the master was marked unused in the store (ms since the epoch), by whoever marked it
   * (a GC pass of another process, Cilium's operator). Only backends with
   * {@linkcode BackendSession.gcMark} keep marks in the store; the grace then counts from it.
   */
  readonly markedAt?: number;
}

/** Options of {@linkcode BackendSession.gcList}. */
export interface GcListOptions {
  /**
   * Called for every entry the pass skipped as damaged (a master or reference it cannot read or
   * judge). A skipped master is never a candidate, so it is never collected.
   */
  readonly onSkip?: (skip: GcSkip) => void;
}

/** Health and bookkeeping of a session, for `status()` and the CLI. */
export interface SessionStatus {
  /** Backend kind, e.g. `deno-kv` or `etcd`. */
  readonly backend: string;
  /** This node's name. */
  readonly node: string;
  /** Store endpoints, or a description of the store. */
  readonly endpoints: readonly string[];
  /** Leader member, when the store has one. */
  readonly leader?: string;
  /** Leases this session holds. */
  readonly leases: number;
  /** When the current lease expires (ms since epoch), if known. */
  readonly leaseExpiresAt?: number;
  /** The last error the session saw in the background (renewal, watch), if any. */
  readonly lastError?: string;
  /** Whether the session currently reaches the store. */
  readonly healthy: boolean;
}

/** Options the allocator passes to {@linkcode Backend.openSession}. */
export interface SessionOptions {
  /** Lifetime of this node's lease in milliseconds; renewed well before it ends. */
  readonly leaseTtlMs: number;
  /** A read-only session writes nothing: no lease, no references (remote clusters, CLI listing). */
  readonly readOnly: boolean;
  /**
   * Whether this process is the node restarting: a writable session then takes over the node's
   * lease record even while it is live. Without it (the default), opening a writable session
   * under a node name whose lease is live (held by another session, in this process or another)
   * throws {@linkcode NodeInUseError} and writes nothing; the check and the write are one atomic
   * step, so two sessions opening one name at once cannot both succeed.
   */
  readonly restart?: boolean;
  /**
   * Called when the node's lease was lost and replaced: every reference bound to the old lease is
   * gone. The allocator then re-creates the references of every key it holds, at once.
   */
  readonly onLeaseReplaced: () => void;
  /** Aborts opening (e.g. granting the first lease). */
  readonly signal?: AbortSignal;
  /**
   * The allocator's GC grace (`gcGraceMs`, resolved). A backend that judges in its GC listing how
   * recently a master was written or marked (Kubernetes, as Cilium's operator does) keeps a
   * master in use for that long; 0 turns that off.
   */
  readonly gcGraceMs?: number;
}

/** A store the allocator can run on. */
export interface Backend {
  /** Backend kind, e.g. `deno-kv` or `etcd`. */
  readonly kind: string;
  /** This node's name; it never contains `/`. */
  readonly node: string;
  /**
   * The store's own default GC grace, when it has one: the allocator's `gcGraceMs` when its options
   * give none, instead of the lease TTL (Kubernetes: Cilium operator's heartbeat timeout).
   */
  readonly defaultGcGraceMs?: number;
  /**
   * Throws {@linkcode InvalidKeyError} if `key` (encoded) cannot be stored: empty, or too large
   * for the store's key or value limits once placed in the layout. Called before any write.
   */
  checkKey(key: string): void;
  /** Opens the session the allocator works through. */
  openSession(options: SessionOptions): Promise<BackendSession>;
  /**
   * The operator's view of the store (namespaces, node leases, references), for tools such as
   * the CLI. It holds nothing that needs closing beyond what the backend already holds.
   */
  admin(): BackendAdmin;
}

/** A live connection of one allocator to the store. Every method takes an `AbortSignal`. */
export interface BackendSession extends AsyncDisposable {
  /**
   * Makes sure `request.key` has a master and this node a live reference to it, atomically:
   * - if the store already maps the key to an ID, reference that ID (`created: false`);
   * - otherwise create a master with a candidate from `pickCandidate` and reference it
   *   (`created: true`).
   *
   * Uncontended, a new key and an existing key each cost one atomic write. When the write loses a
   * race the session re-reads once and tries again; if it still cannot finish it throws
   * {@linkcode ConflictError} (retryable). Throws {@linkcode PoolExhaustedError} when a new master
   * is needed and `pickCandidate` returns `undefined`.
   *
   * Invariants: no interleaving of any number of nodes gives one key two live IDs or one ID two
   * keys; an unreferenced master left for the key is reused, never duplicated.
   */
  acquire(request: AcquireRequest): Promise<AcquireResult>;

  /**
   * Deletes this node's reference to `key`, whatever ID it holds (`id` is informational and may be
   * 0 when the allocator cleans up after an aborted acquire). The master stays (GC reclaims it).
   * Deleting a reference that does not exist is not an error.
   */
  release(key: string, id: number, signal: AbortSignal): Promise<void>;

  /**
   * For each held key: re-create a missing master (only if the ID is free and the key has no
   * other master) and a missing or dead reference of this node. Batched for fewer round trips.
   * The allocator guarantees none of these keys is being released concurrently.
   */
  ensure(held: readonly HeldKey[], signal: AbortSignal): Promise<EnsureReport[]>;

  /** The ID the store maps `key` to, reading the store (Cilium's `GetNoCache`). */
  get(key: string, signal: AbortSignal): Promise<number | undefined>;

  /** The encoded key of master `id`, reading the store. */
  getById(id: number, signal: AbortSignal): Promise<string | undefined>;

  /**
   * Every master as `upsert` (the initial list), then `synced` once, then live changes. After a
   * re-list (compaction, resync) the session reports `delete` for what vanished. Corrupt entries
   * are logged and skipped. Ends when `signal` aborts or the session closes.
   */
  watch(signal: AbortSignal): AsyncIterable<BackendEvent>;

  /**
   * Every master with `min <= id <= max` (as stored), with its GC version and whether it is in use.
   * Damaged entries are skipped (logged, and reported to `options.onSkip`): one bad entry never
   * ends the listing.
   */
  gcList(
    range: { min: number; max: number },
    signal: AbortSignal,
    options?: GcListOptions,
  ): AsyncIterable<GcCandidate>;

  /**
   * Deletes the master of `candidate` (and the key's index and dead references) only if, at the
   * commit point, the version is unchanged and the key has no live reference. Returns whether it
   * deleted. GC can therefore never delete an ID a node has just (re)acquired.
   */
  gcDelete(candidate: GcCandidate, signal: AbortSignal): Promise<boolean>;

  /**
   * Optional: marks `candidate` unused **in the store** (on Kubernetes, Cilium's own
   * `io.cilium.heartbeat` annotation), only if it is still at `candidate.version`. Returns the
   * version after the mark (what a later `gcDelete` must find), or `undefined` when the master
   * changed or vanished meanwhile. A node that acquires the key removes the mark, which changes
   * the version again. Backends without it keep GC's marks in the collecting process only.
   */
  gcMark?(candidate: GcCandidate, signal: AbortSignal): Promise<string | undefined>;

  /**
   * Optional: whether master version `a` (a watch `upsert`'s `version`) is newer than `b`, for a
   * store whose versions are ordered (etcd's mod revisions, Deno KV's versionstamps). There,
   * Cilium's lookup answers a split key's newest master, and the re-check waits for it. Absent
   * (Kubernetes: resource versions are opaque, the API allows comparing them only for equality),
   * the core never orders versions.
   */
  newerVersion?(a: string, b: string): boolean;

  /**
   * The time (ms since the epoch, own clock) until which every reference this session wrote is
   * certainly alive for every observer, so that no other node may collect its ID: the lease's
   * last confirmed renewal plus its TTL, less the clock-skew margin where liveness is judged on
   * wall clocks. `Infinity` for a read-only session. Past it, the allocator fences the node: it
   * stops answering from memory until it has re-checked its keys.
   */
  claimValidUntil(): number;

  /**
   * Renews the node's lease now and waits for the store's confirmation, replacing the lease if
   * it lapsed (then `onLeaseReplaced` runs). Resolves even when renewal failed; the caller reads
   * {@linkcode BackendSession.claimValidUntil} afterwards.
   */
  renew(signal: AbortSignal): Promise<void>;

  /** Health and bookkeeping. */
  status(): SessionStatus;

  /** Stops renewals and watches. Does not delete references (the lease lapses on its own). */
  close(): Promise<void>;
}
