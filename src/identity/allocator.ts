/**
 * The identity allocator (Cilium's `CachingIdentityAllocator`): reserved identities, node-local
 * identities, global identities from the kvstore allocator, and remote clusters merged into lookups
 * and one batched change stream.
 *
 * @module
 */
import { z } from "../deps/zod.ts";
import { Allocator } from "../allocator/allocator.ts";
import type { Backend } from "../allocator/backend.ts";
import type { BackoffOptions, CallOptions, GcRateLimit, GcStats } from "../allocator/types.ts";
import { ClosedError, InvalidIdError, InvalidOptionsError } from "../errors.ts";
import { abortable } from "../abort.ts";
import { idallocLogger } from "../log.ts";
import { TaskGroup } from "../task_group.ts";
import { parseOptions } from "../validate.ts";
import { ChangeHub } from "./changes.ts";
import { LabelError } from "./errors.ts";
import { Labels, labelsCodec } from "./labels.ts";
import { LocalIdentityCache, type LocalIdentityEvent } from "./local.ts";
import {
  allocationRange,
  checkClusterId,
  clusterIdShift,
  hasLocalScope,
  hasRemoteNodeScope,
  IdentityScope,
  MAX_NUMERIC_IDENTITY,
  type MaxConnectedClusters,
} from "./numeric.ts";
import { RemoteCluster } from "./remote.ts";
import { ReservedIdentities, UNKNOWN_IDENTITY } from "./reserved.ts";
import { scopeForLabels } from "./scope.ts";
import type { Identity, IdentityChange } from "./types.ts";
import { identityOf } from "../telemetry/allocator.ts";
import { IdentityCounts } from "../telemetry/identity.ts";

const log = idallocLogger("identity");

/** Options of {@linkcode IdentityAllocator.open}. */
export interface IdentityAllocatorOptions {
  /** This cluster's ID; its global identities come from its range. @default {0} */
  readonly clusterId?: number;
  /**
   * This cluster's name: part of the well-known label sets, and what remote clusters expect in
   * `k8s:io.cilium.k8s.policy.cluster` of this cluster's identities. @default {"default"}
   */
  readonly clusterName?: string;
  /** 255 (cluster ID in bits 16–23) or 511 (bits 15–23). @default {255} */
  readonly maxConnectedClusters?: MaxConnectedClusters;
  /** The namespace Cilium runs in (well-known label sets). @default {"kube-system"} */
  readonly ciliumNamespace?: string;
  /** User-reserved identities: ID (128–255) → name for `io.cilium.fixed-identity=<name>`. */
  readonly fixedIdentities?: Readonly<Record<number, string>>;
  /**
   * Label sets with `reserved:remote-node` get node-local identities in the remote-node scope
   * (`2 << 24`) instead of reserved IDs 6/7. @default {false}
   */
  readonly remoteNodeScope?: boolean;
  /** Lease lifetime of this node's references, in ms (see `AllocatorOptions`). */
  readonly leaseTtlMs?: number;
  /** Period of the allocator's local key sync, in ms. */
  readonly syncIntervalMs?: number;
  /** Run a GC pass over this cluster's range every this many ms. Off when unset. */
  readonly gcIntervalMs?: number;
  /** Time an ID must have been unused before GC deletes it (see `AllocatorOptions`). */
  readonly gcGraceMs?: number;
  /** Rate limit of GC deletions. */
  readonly gcRateLimit?: GcRateLimit;
  /** Attempts per global allocation. */
  readonly maxAttempts?: number;
  /** Backoff between attempts. */
  readonly backoff?: BackoffOptions;
  /**
   * Write-behind release of global identities (see `AllocatorOptions.releaseInBackground` and
   * {@linkcode IdentityAllocator.flush}). @default {false}
   */
  readonly releaseInBackground?: boolean;
  /**
   * This process is the backend's node restarting: take over its live lease record (see
   * `AllocatorOptions.restart`; without it a live node name throws `NodeInUseError`).
   * @default {false}
   */
  readonly restart?: boolean;
}

/** Options of {@linkcode IdentityAllocator.allocate}. */
export interface AllocateIdentityOptions extends CallOptions {
  /**
   * A node-local ID this label set had before (e.g. before a restart); reused if it is in the
   * right scope and free. Ignored for global identities.
   */
  readonly oldId?: number;
  /** Report a newly created identity on the change stream at once. @default {true} */
  readonly notify?: boolean;
}

/** The result of {@linkcode IdentityAllocator.allocate}. */
export interface AllocateIdentityResult {
  /** The identity. */
  readonly identity: Identity;
  /**
   * True when this call created it: a new master in the store (global), or a new node-local
   * identity. Always false for reserved identities.
   */
  readonly isNew: boolean;
}

/** Options of {@linkcode IdentityAllocator.release}. */
export interface ReleaseIdentityOptions extends CallOptions {
  /** Report a node-local identity's last release on the change stream. @default {true} */
  readonly notify?: boolean;
}

/** Options of {@linkcode IdentityAllocator.changes}. */
export interface ChangesOptions extends CallOptions {
  /** Start with one batch holding every identity currently known. @default {true} */
  readonly replay?: boolean;
}

/** Options of {@linkcode IdentityAllocator.watchRemote}. */
export interface WatchRemoteOptions extends CallOptions {
  /** The remote cluster's ID; only identities in its range are accepted. */
  readonly clusterId: number;
}

/** A remote cluster as {@linkcode IdentityAllocator.remotes} reports it. */
export interface RemoteClusterInfo {
  /** Its name. */
  readonly name: string;
  /** Its cluster ID. */
  readonly clusterId: number;
  /** Identities of it currently known. */
  readonly identities: number;
}

const labelValue = z.string().min(1).refine((s) => !s.includes(";"), "must not contain ';'");

const optionsSchema = z.object({
  clusterId: z.number().int().min(0).default(0),
  clusterName: labelValue.default("default"),
  maxConnectedClusters: z.union([z.literal(255), z.literal(511)]).default(255),
  ciliumNamespace: labelValue.default("kube-system"),
  fixedIdentities: z.record(z.string(), z.string()).optional(),
  remoteNodeScope: z.boolean().default(false),
  leaseTtlMs: z.number().optional(),
  syncIntervalMs: z.number().optional(),
  gcIntervalMs: z.number().optional(),
  gcGraceMs: z.number().optional(),
  gcRateLimit: z.object({}).loose().optional(),
  maxAttempts: z.number().optional(),
  backoff: z.object({}).loose().optional(),
  releaseInBackground: z.boolean().optional(),
  restart: z.boolean().optional(),
}).strict();

const remoteSchema = z.object({
  name: labelValue,
  clusterId: z.number().int().min(0),
});

/**
 * Security identities for label sets, the same on every node of a cluster:
 * - label sets of Cilium's reserved, well-known and user-reserved identities get those IDs;
 * - all-`cidr`/`fqdn`/`reserved` label sets get node-local IDs (`0x01000000 | n`);
 * - every other label set gets a global ID from the store, in this cluster's range.
 *
 * Identities of remote clusters ({@linkcode IdentityAllocator.watchRemote}) join lookups and the
 * change stream. Open with {@linkcode IdentityAllocator.open}; close with `close()` or
 * `await using`.
 */
export class IdentityAllocator implements AsyncDisposable {
  /** This cluster's ID. */
  readonly clusterId: number;
  /** This cluster's name. */
  readonly clusterName: string;
  /** 255 or 511. */
  readonly maxConnectedClusters: MaxConnectedClusters;
  /** The global identities this cluster allocates: `[min, max]`. */
  readonly range: { readonly min: number; readonly max: number };
  /** The reserved, well-known and user-reserved identities. */
  readonly reserved: ReservedIdentities;
  readonly #main: Allocator<Labels>;
  readonly #hub: ChangeHub;
  readonly #local: LocalIdentityCache;
  readonly #remoteNode: LocalIdentityCache;
  readonly #remotes = new Map<string, RemoteCluster>();
  /**
   * Global identities this node holds. The allocator's cache learns a fresh ID only from the
   * store's watch echo; until then lookups by ID still find what this node itself allocated.
   */
  readonly #held = new Map<number, Labels>();
  /** Remotes being opened or synced, so that `close()` can stop them too. */
  readonly #pendingRemotes = new Set<RemoteCluster>();
  /** The main allocator's event pump runs in it; closing aborts its signal. */
  readonly #tasks = new TaskGroup("identity allocator");
  /** `idalloc.identities` while open. */
  readonly #counts: IdentityCounts;
  #closed: Promise<void> | undefined;

  private constructor(
    settings: z.infer<typeof optionsSchema>,
    range: { min: number; max: number },
    reserved: ReservedIdentities,
    main: Allocator<Labels>,
    hub: ChangeHub,
  ) {
    this.clusterId = settings.clusterId;
    this.clusterName = settings.clusterName;
    this.maxConnectedClusters = settings.maxConnectedClusters;
    this.range = range;
    this.reserved = reserved;
    this.#main = main;
    this.#hub = hub;
    const onChange = (event: LocalIdentityEvent) => {
      if (event.type === "upsert") hub.add(event.id, event.labels);
      else hub.delete(event.id);
    };
    this.#local = new LocalIdentityCache({ scope: IdentityScope.Local, onChange });
    this.#remoteNode = new LocalIdentityCache({ scope: IdentityScope.RemoteNode, onChange });
    this.#tasks.spawn(this.#pumpMain());
    const reservedCount = [...reserved].length;
    this.#counts = new IdentityCounts(identityOf(main.backend), () => ({
      reserved: reservedCount,
      global: main.status().cachedIds,
      local: this.#local.size,
      remoteNode: this.#remoteNode.size,
      remoteClusters: [...this.#remotes.values()].map((r) => ({
        name: r.name,
        count: r.published.size,
      })),
    }));
    this.#counts.open();
  }

  /**
   * Opens the identity allocator of one node on `backend` (the backend carries the node's name).
   * The global allocator uses this cluster's range, its cluster-ID prefix and master-key
   * protection. Throws {@linkcode InvalidOptionsError} for bad options.
   */
  static async open(
    backend: Backend,
    options: IdentityAllocatorOptions = {},
    callOptions?: CallOptions,
  ): Promise<IdentityAllocator> {
    const settings = parseOptions(optionsSchema, options, "identity allocator options");
    checkClusterId(settings.clusterId, settings.maxConnectedClusters);
    const range = allocationRange(settings.clusterId, settings.maxConnectedClusters);
    const shift = clusterIdShift(settings.maxConnectedClusters);
    const reserved = new ReservedIdentities({
      clusterName: settings.clusterName,
      ciliumNamespace: settings.ciliumNamespace,
      fixedIdentities: settings.fixedIdentities,
      remoteNodeScope: settings.remoteNodeScope,
    });
    const main = await Allocator.open<Labels>(backend, {
      min: range.min,
      max: range.max,
      // A no-op for cluster IDs > 0 (min already carries the bits); kept for Cilium parity.
      prefixMask: settings.clusterId * 2 ** shift,
      codec: labelsCodec,
      masterKeyProtection: true,
      leaseTtlMs: settings.leaseTtlMs,
      syncIntervalMs: settings.syncIntervalMs,
      gcIntervalMs: settings.gcIntervalMs,
      gcGraceMs: settings.gcGraceMs,
      gcRateLimit: settings.gcRateLimit,
      maxAttempts: settings.maxAttempts,
      backoff: settings.backoff,
      releaseInBackground: settings.releaseInBackground,
      restart: settings.restart,
    }, callOptions);
    return new IdentityAllocator(settings, range, reserved, main, new ChangeHub());
  }

  async #pumpMain(): Promise<void> {
    try {
      const signal = this.#tasks.signal;
      for await (const event of this.#main.watch({ signal })) {
        if (event.type === "upsert") this.#hub.add(event.id, event.key);
        else if (event.type === "delete") this.#hub.delete(event.id);
        else if (event.type === "reassigned") {
          this.#onReassigned(event.key, event.oldId, event.newId);
        }
      }
    } catch (err) {
      if (!this.#tasks.closed) log.error("identity watch failed: {err}", { err });
    }
  }

  /**
   * A held identity lost its ID while this node was fenced and now has `newId`. Consumers hear of
   * the new identity now; the old ID reaches them through the allocator's own events (a delete
   * when its master is gone, an add when other labels have it).
   */
  #onReassigned(labels: Labels, oldId: number, newId: number): void {
    if (this.#held.get(oldId)?.equals(labels)) this.#held.delete(oldId);
    this.#held.set(newId, labels);
    this.#hub.add(newId, labels);
  }

  #checkOpen(): void {
    if (this.#closed) throw new ClosedError("identity allocator");
  }

  #signal(options?: CallOptions): AbortSignal {
    return this.#tasks.bound(options?.signal);
  }

  /**
   * The identity of `labels`, creating it if needed, with one more local reference to it:
   * reserved → that identity (never the store); local scope → a node-local identity (never the
   * store); otherwise the global identity from the store (waits for the initial sync). Throws
   * {@linkcode LabelError} for an empty label set, {@linkcode PoolExhaustedError} when the scope
   * or range is full, and the allocator's errors for the store.
   */
  async allocate(
    labels: Labels,
    options: AllocateIdentityOptions = {},
  ): Promise<AllocateIdentityResult> {
    this.#checkOpen();
    const local = this.#allocateLocal(labels, options);
    if (local) return local;
    const { id, isNew } = await this.#main.allocate(labels, { signal: this.#signal(options) });
    if (id > MAX_NUMERIC_IDENTITY) {
      throw new InvalidIdError(
        `ID ${id} is too large for a numeric identity (at most ${MAX_NUMERIC_IDENTITY})`,
      );
    }
    const identity: Identity = Object.freeze({ id, labels });
    this.#held.set(id, labels);
    // Like Cilium's owner update: consumers hear of a new identity now, not after the watch echo.
    if (isNew && (options.notify ?? true)) this.#hub.add(id, labels);
    return { identity, isNew };
  }

  /**
   * Cilium's `AllocateLocalIdentity`: like {@linkcode IdentityAllocator.allocate} but only for
   * reserved and node-local label sets, synchronously. Throws {@linkcode LabelError} ("labels
   * would result in global identity") otherwise.
   */
  allocateLocal(labels: Labels, options: AllocateIdentityOptions = {}): AllocateIdentityResult {
    this.#checkOpen();
    const local = this.#allocateLocal(labels, options);
    if (!local) throw new LabelError("labels would result in global identity");
    return local;
  }

  #allocateLocal(
    labels: Labels,
    options: AllocateIdentityOptions,
  ): AllocateIdentityResult | undefined {
    if (!(labels instanceof Labels)) throw new LabelError("labels must be a Labels set");
    const reserved = this.reserved.lookupByLabels(labels);
    if (reserved) return { identity: reserved, isNew: false };
    const cache = this.#cacheFor(scopeForLabels(labels));
    if (cache) return cache.lookupOrCreate(labels, options.oldId ?? 0, options.notify ?? true);
    if (labels.size === 0) throw new LabelError("an identity needs at least one label");
    return undefined;
  }

  #cacheFor(scope: number): LocalIdentityCache | undefined {
    if (scope === IdentityScope.Local) return this.#local;
    if (scope === IdentityScope.RemoteNode) return this.#remoteNode;
    return undefined;
  }

  /**
   * Drops one reference to `identity`. Returns true on the last local use: a node-local identity
   * is then gone (and reported deleted); a global identity's reference leaves the store, but the
   * identity itself stays until GC, and its deletion reaches the change stream only then.
   * Reserved identities are never released (false).
   */
  async release(identity: Identity, options: ReleaseIdentityOptions = {}): Promise<boolean> {
    this.#checkOpen();
    if (this.reserved.isReserved(identity.id)) return false;
    const cache = this.#cacheFor(scopeForLabels(identity.labels));
    if (cache) return cache.release(identity.id, options.notify ?? true);
    const { lastUse } = await this.#main.release(identity.labels, {
      signal: this.#signal(options),
    });
    // By labels, not by `identity.id`: a held set that moved while fenced is held at its new ID.
    if (lastUse) {
      for (const [id, held] of this.#held) if (held.equals(identity.labels)) this.#held.delete(id);
    }
    return lastUse;
  }

  /**
   * Waits until the deletion of every global identity's reference released so far has reached the
   * store, or failed and been left to the sync (with `releaseInBackground`; else at once).
   */
  async flush(options: CallOptions = {}): Promise<void> {
    this.#checkOpen();
    await this.#main.flush({ signal: this.#signal(options) });
  }

  /**
   * The identity of `labels` as known here, without store access: reserved, node-local, then the
   * global cache and the remote clusters' caches.
   */
  lookup(labels: Labels): Identity | undefined {
    const reserved = this.reserved.lookupByLabels(labels);
    if (reserved) return reserved;
    const cache = this.#cacheFor(scopeForLabels(labels));
    if (cache) return cache.lookup(labels);
    if (labels.size === 0) return undefined;
    let id = this.#main.cachedId(labels);
    if (id === undefined) {
      for (const remote of this.#remotes.values()) {
        id = remote.allocator.cachedId(labels);
        if (id !== undefined) break;
      }
    }
    return id === undefined || id > MAX_NUMERIC_IDENTITY ? undefined : { id, labels };
  }

  /**
   * The identity `id` as known here, without store access. ID 0 is `reserved:unknown`.
   */
  lookupById(id: number): Identity | undefined {
    if (!Number.isSafeInteger(id) || id < 0) return undefined;
    if (id === 0) return UNKNOWN_IDENTITY;
    const reserved = this.reserved.lookupById(id);
    if (reserved) return reserved;
    if (hasLocalScope(id)) return this.#local.lookupById(id);
    if (hasRemoteNodeScope(id)) return this.#remoteNode.lookupById(id);
    const labels = this.#cachedLabels(id);
    return labels && { id, labels };
  }

  #cachedLabels(id: number): Labels | undefined {
    const labels = this.#main.cachedKey(id) ?? this.#held.get(id);
    if (labels) return labels;
    for (const remote of this.#remotes.values()) {
      const found = remote.allocator.cachedKey(id);
      if (found) return found;
    }
    return undefined;
  }

  /**
   * Cilium's `LookupIdentity`: {@linkcode IdentityAllocator.lookup}, then, for a global label set
   * nobody here knows, the store of this cluster.
   */
  async resolve(labels: Labels, options?: CallOptions): Promise<Identity | undefined> {
    this.#checkOpen();
    const known = this.lookup(labels);
    if (known !== undefined && this.#held.get(known.id)?.equals(labels)) {
      // A held label set is answered as the allocator's get answers it: while the node is fenced
      // and the set is being re-checked, once the re-check is done — the cache may still show the
      // ID it is leaving (a release reported with that ID would name the wrong identity).
      const id = await this.#main.get(labels, { signal: this.#signal(options) });
      if (id !== undefined && id <= MAX_NUMERIC_IDENTITY) return { id, labels };
    }
    if (known || labels.size === 0 || this.#cacheFor(scopeForLabels(labels))) return known;
    const id = await this.#main.getNoCache(labels, { signal: this.#signal(options) });
    return id === undefined || id > MAX_NUMERIC_IDENTITY ? undefined : { id, labels };
  }

  /**
   * Cilium's `LookupIdentityByID`: {@linkcode IdentityAllocator.lookupById}, then, for a global ID
   * nobody here knows, the store of this cluster.
   */
  async resolveById(id: number, options?: CallOptions): Promise<Identity | undefined> {
    this.#checkOpen();
    const known = this.lookupById(id);
    if (known || !Number.isSafeInteger(id) || id <= 0) return known;
    if (this.reserved.isReserved(id) || hasLocalScope(id) || hasRemoteNodeScope(id)) return known;
    const labels = await this.#main.getById(id, { signal: this.#signal(options) });
    return labels && { id, labels };
  }

  /**
   * Every identity known here (Cilium's `GetIdentityCache`): reserved, well-known and
   * user-reserved, node-local, global, and remote clusters'.
   */
  *entries(): IterableIterator<Identity> {
    yield* this.reserved;
    yield* this.#local.entries();
    yield* this.#remoteNode.entries();
    yield* this.#globals();
    for (const remote of this.#remotes.values()) {
      for (const [id, labels] of remote.allocator.entries()) yield { id, labels };
    }
  }

  *#globals(): IterableIterator<Identity> {
    for (const [id, labels] of this.#main.entries()) yield { id, labels };
    for (const [id, labels] of this.#held) {
      if (this.#main.cachedKey(id) === undefined) yield { id, labels };
    }
  }

  #snapshot(): Array<[number, Labels]> {
    const out: Array<[number, Labels]> = [];
    for (const { id, labels } of this.#local.entries()) out.push([id, labels]);
    for (const { id, labels } of this.#remoteNode.entries()) out.push([id, labels]);
    for (const { id, labels } of this.#globals()) out.push([id, labels]);
    for (const remote of this.#remotes.values()) out.push(...remote.published);
    return out;
  }

  /**
   * A stream of batched changes of the non-reserved identities (Cilium's owner callback
   * `UpdateIdentities(added, deleted)`): global ones from the store's watch, node-local ones as
   * they are created and released, remote clusters' as they come and go. Starts with one batch of
   * everything known unless `replay` is false. Recording a change never waits for a consumer; a
   * slow consumer gets bigger batches. Ends when `signal` aborts or the allocator closes.
   */
  changes(options: ChangesOptions = {}): AsyncIterable<IdentityChange> {
    this.#checkOpen();
    const initial = options.replay ?? true ? this.#snapshot() : [];
    return this.#hub.subscribe(initial, options.signal);
  }

  /**
   * Merges the identities of remote cluster `name` (clustermesh): opens a read-only allocator on
   * `backend` that accepts only IDs in the range of `clusterId` carrying
   * `k8s:io.cilium.k8s.policy.cluster=<name>` (anything else is logged and skipped), and resolves
   * once its identities are in lookups and the change stream. A remote already watched under
   * `name` is replaced; IDs only the old one had are reported deleted.
   *
   * The remote stays until `signal` aborts or {@linkcode IdentityAllocator.removeRemote}; its
   * identities are then withdrawn (reported deleted). If `signal` aborts before the initial list
   * is in, this rejects with `signal.reason` and nothing of the new remote remains.
   */
  async watchRemote(name: string, backend: Backend, options: WatchRemoteOptions): Promise<void> {
    this.#checkOpen();
    const { clusterId } = parseOptions(
      remoteSchema,
      { name, clusterId: options?.clusterId },
      "remote options",
    );
    checkClusterId(clusterId, this.maxConnectedClusters);
    if (clusterId === this.clusterId) {
      throw new InvalidOptionsError(`remote ${name} has this cluster's own ID ${clusterId}`);
    }
    if (name === this.clusterName) {
      throw new InvalidOptionsError(`remote cluster name ${name} is this cluster's own name`);
    }
    for (const other of this.#remotes.values()) {
      if (other.name !== name && other.clusterId === clusterId) {
        throw new InvalidOptionsError(
          `cluster ID ${clusterId} of remote ${name} is already used by remote ${other.name}`,
        );
      }
    }
    const signal = this.#signal(options);
    const remote = await RemoteCluster.open(
      name,
      clusterId,
      this.maxConnectedClusters,
      backend,
      this.#hub,
      signal,
    );
    this.#pendingRemotes.add(remote);
    try {
      await abortable(remote.synced, signal);
    } catch (err) {
      remote.halt();
      // Withdraw what the aborted remote published, except what the registered one still has.
      const current = this.#remotes.get(name);
      for (const id of remote.published.keys()) {
        if (!current?.published.has(id)) this.#hub.delete(id);
      }
      await remote.close();
      throw err;
    } finally {
      this.#pendingRemotes.delete(remote);
    }
    if (this.#closed) {
      await remote.close();
      throw new ClosedError("identity allocator");
    }
    const old = this.#remotes.get(name);
    this.#remotes.set(name, remote);
    // Listen before any further await: an abort in between must still withdraw this remote.
    // Closing the remote removes the listener: a listener on a timeout signal (`AbortSignal.timeout`)
    // keeps its timer, and so the process, alive until it fires.
    const callerSignal = options.signal;
    if (callerSignal) {
      const withdraw = () => void this.#withdraw(remote);
      callerSignal.addEventListener("abort", withdraw, { once: true });
      remote.onClose(() => callerSignal.removeEventListener("abort", withdraw));
      if (callerSignal.aborted) withdraw();
    }
    if (old) {
      old.halt();
      for (const id of old.published.keys()) {
        if (!remote.published.has(id)) this.#hub.delete(id);
      }
      await old.close();
    }
    log.info("watching identities of remote cluster {name} (ID {clusterId})", { name, clusterId });
  }

  /**
   * Stops watching remote cluster `name` and withdraws its identities (reported deleted).
   * Returns whether such a remote was watched.
   */
  async removeRemote(name: string): Promise<boolean> {
    const remote = this.#remotes.get(name);
    if (!remote) return false;
    await this.#withdraw(remote);
    return true;
  }

  async #withdraw(remote: RemoteCluster): Promise<void> {
    if (this.#remotes.get(remote.name) === remote) {
      this.#remotes.delete(remote.name);
      remote.halt();
      for (const id of remote.published.keys()) this.#hub.delete(id);
      log.info("withdrew identities of remote cluster {name}", { name: remote.name });
    }
    await remote.close().catch((err) => log.warning("closing remote failed: {err}", { err }));
  }

  /** The remote clusters currently merged. */
  remotes(): RemoteClusterInfo[] {
    return [...this.#remotes.values()].map((r) => ({
      name: r.name,
      clusterId: r.clusterId,
      identities: r.published.size,
    }));
  }

  /**
   * Keeps node-local `ids` from being handed out by the sequential scan until they are requested
   * by `oldId` or un-withheld (Cilium's restore after restart). Returns the IDs in no local scope.
   */
  withholdLocal(ids: Iterable<number>): number[] {
    const foreign = this.#remoteNode.withhold(this.#local.withhold(ids));
    if (foreign.length > 0) {
      log.error("cannot withhold non-local identities {ids}", { ids: foreign });
    }
    return foreign;
  }

  /** Makes withheld node-local `ids` available again. */
  unwithholdLocal(ids: Iterable<number>): void {
    const list = [...ids];
    this.#local.unwithhold(list);
    this.#remoteNode.unwithhold(list);
  }

  /** Resolves once the global identities of the store are in the cache. */
  async waitForInitialSync(options?: CallOptions): Promise<void> {
    this.#checkOpen();
    await this.#main.waitForInitialSync({ signal: this.#signal(options) });
  }

  /**
   * One GC pass over this cluster's range only (two passes collect an unused identity). Remote
   * clusters are never collected from here.
   */
  async runGc(options?: CallOptions): Promise<GcStats> {
    this.#checkOpen();
    return await this.#main.runGc({ signal: this.#signal(options) });
  }

  /**
   * Stops the watches, closes the remote clusters' and the global allocator, and ends every change
   * stream. Does not delete this node's references (they lapse with its lease). Idempotent.
   */
  close(): Promise<void> {
    // The pump ends once the main allocator closes its watch; the group then waits for it.
    this.#closed ??= this.#tasks.close(async () => {
      this.#counts.close();
      const remotes = [...this.#remotes.values(), ...this.#pendingRemotes];
      this.#remotes.clear();
      for (const remote of remotes) remote.halt();
      this.#hub.close();
      await Promise.allSettled(remotes.map((r) => r.close()));
      await this.#main.close();
    });
    return this.#closed;
  }

  /** Same as {@linkcode IdentityAllocator.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
