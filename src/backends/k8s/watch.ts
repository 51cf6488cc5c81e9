/**
 * The session's informer over the identity resource (client-go's list-and-watch, as Cilium's
 * `ListAndWatch` runs it): a list, then a watch from the list's resource version with bookmarks.
 * As client-go's reflector, the first list is served from the API server's watch cache
 * (`resourceVersion=0`, one response: a fresh node syncs about as fast as Cilium's; the snapshot
 * may trail the newest write a little, and the watch from its version delivers the rest), and a
 * re-list after `410 Gone` is a consistent paged list from etcd. A watch that ends is resumed from the last resource version seen (a
 * bookmark moves it too); `410 Gone` (the version was compacted away) re-lists and reports the
 * difference, so nothing is lost and nothing repeated.
 *
 * It keeps the index the protocol decides by: ID → {@linkcode IdentityRecord} and key → IDs, and
 * answers Cilium's answer for a key (the oldest identity of it). Objects that are no identity
 * idalloc can read (a name that is not a decimal ID, labels that do not decode) are logged and
 * left out, never fatal. The session's own writes enter the index at once
 * ({@linkcode IdentityInformer.observe}); the watch's echo of them then changes nothing.
 * Resource versions are compared only for equality, as the API allows: the order of an
 * identity's versions is the watch's own order (`own_writes.ts`).
 *
 * The telemetry counts each list by its reason (`idalloc.watch.relists`: `initial`, `expired`)
 * and each failed list or watch that is tried again (`idalloc.watch.reconnects`); a watch the
 * server ends on time (`timeoutSeconds`) is resumed without counting.
 *
 * Every `watch()` of the session subscribes here: it gets the index as `upsert`s, `synced`, then
 * live changes (an `upsert` per new version of an identity, a `delete` per vanished one).
 *
 * @module
 */
import type { BackendEvent } from "../../allocator/backend.ts";
import { EventQueue } from "../../allocator/event_queue.ts";
import { abortable, sleep } from "../../abort.ts";
import { errorMessage } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import {
  isStatus,
  type KubeClient,
  type KubeObject,
  type KubeResource,
  type KubeWatchEvent,
  rvOf,
} from "./kube.ts";
import { answerOf, type IdentityRecord, idOfName, readIdentity } from "./layout.ts";
import {
  WATCH_IDLE_MS,
  WATCH_RETRY_MAX_MS,
  WATCH_RETRY_MIN_MS,
  WATCH_TIMEOUT_SECONDS,
} from "./limits.ts";
import { OwnWrites } from "./own_writes.ts";
import { ViewFreshness } from "./view_freshness.ts";
import { listAll } from "./paging.ts";
import { type Backoff, backoffDelay } from "../../allocator/backoff.ts";

/** The reconnect backoff: full jitter, doubling from {@linkcode WATCH_RETRY_MIN_MS} up to 30 s. */
export const WATCH_BACKOFF: Backoff = {
  initialMs: WATCH_RETRY_MIN_MS,
  maxMs: WATCH_RETRY_MAX_MS,
  factor: 2,
};

const log = idallocLogger("k8s", "watch");

/**
 * An informer's watch of `res` (all namespaces for a namespaced one) from `resourceVersion`, with
 * bookmarks. As client-go's reflector: the server ends each watch after 5–10 minutes, spreading
 * the re-watches of many nodes; a connection silent past two bookmark periods is dead.
 */
export function informerWatch(
  client: KubeClient,
  res: KubeResource,
  resourceVersion: string,
  signal: AbortSignal,
): AsyncIterable<KubeWatchEvent> {
  return client.watch(res, {
    allNamespaces: res.namespaced,
    resourceVersion,
    bookmarks: true,
    timeoutSeconds: WATCH_TIMEOUT_SECONDS + Math.floor(Math.random() * WATCH_TIMEOUT_SECONDS),
    idleTimeoutMs: WATCH_IDLE_MS,
    signal,
  });
}

type Change = Exclude<BackendEvent, { type: "synced" }>;

/**
 * Why the informer lists every identity (the telemetry's `idalloc.reason`): `initial` (from the
 * watch cache), `expired` (after `410 Gone`: a consistent list from etcd).
 */
type RelistReason = "initial" | "expired";

/** What the informer tells its session. */
export interface InformerHooks {
  /** A list or watch failed (it is retried with backoff). */
  onError(err: unknown): void;
  /** A list or watch answered. */
  onSuccess(): void;
  /** An identity entered the index or changed in it (the session keeps its own ones unmarked). */
  onRecord(record: IdentityRecord): void;
}

/** The ID → identity and key → IDs index with Cilium's answer rule. */
export class IdentityIndex {
  readonly #byId = new Map<number, IdentityRecord>();
  /** A key's one ID as a number, a `Set` only for a key with several (about 90 B saved each). */
  readonly #byKey = new Map<string, number | Set<number>>();

  /** How many identities it holds. */
  get size(): number {
    return this.#byId.size;
  }

  /** The identity of `id`. */
  get(id: number): IdentityRecord | undefined {
    return this.#byId.get(id);
  }

  /** Every identity of `key`. */
  ofKey(key: string): IdentityRecord[] {
    const ids = this.#byKey.get(key);
    if (ids === undefined) return [];
    return typeof ids === "number"
      ? [this.#byId.get(ids)!]
      : [...ids].map((id) => this.#byId.get(id)!);
  }

  /** Cilium's answer for `key` (see `answerOf`). */
  answer(key: string): IdentityRecord | undefined {
    return answerOf(this.ofKey(key));
  }

  /** Every identity. */
  records(): IterableIterator<IdentityRecord> {
    return this.#byId.values();
  }

  /** Sets `record`; returns the one it replaced. */
  set(record: IdentityRecord): IdentityRecord | undefined {
    const old = this.#byId.get(record.id);
    if (old !== undefined && old.key !== record.key) this.#unlink(old.key, old.id);
    this.#byId.set(record.id, record);
    const ids = this.#byKey.get(record.key);
    if (ids === undefined || ids === record.id) this.#byKey.set(record.key, record.id);
    else if (typeof ids === "number") this.#byKey.set(record.key, new Set([ids, record.id]));
    else ids.add(record.id);
    return old;
  }

  /** Removes `id`; returns what it held. */
  delete(id: number): IdentityRecord | undefined {
    const old = this.#byId.get(id);
    if (old === undefined) return undefined;
    this.#byId.delete(id);
    this.#unlink(old.key, id);
    return old;
  }

  #unlink(key: string, id: number): void {
    const ids = this.#byKey.get(key);
    if (ids === id) this.#byKey.delete(key);
    else if (typeof ids === "object") {
      ids.delete(id);
      if (ids.size === 1) this.#byKey.set(key, ids.values().next().value!);
    }
  }
}

/** The informer (see the module doc). */
export class IdentityInformer {
  /** The index; read it only after {@linkcode IdentityInformer.waitSynced}. */
  readonly index: IdentityIndex = new IdentityIndex();
  readonly #ctx: K8sContext;
  readonly #hooks: InformerHooks;
  readonly #signal: AbortSignal;
  readonly #subscribers = new Set<EventQueue<BackendEvent>>();
  readonly #synced = Promise.withResolvers<void>();
  /** Resource versions of the objects left out as damaged, by name (logged once per version). */
  readonly #damaged = new Map<string, string>();
  #isSynced = false;
  #resourceVersion = "";
  /** This session's writes the watch has not delivered yet (the order without comparing versions). */
  readonly #own = new OwnWrites(WATCH_IDLE_MS);
  /** Set once the loop ends (the session closed). */
  readonly done: Promise<void>;
  /**
   * Whether the index is provably current (`view_freshness.ts`): `acquire` reads the store before
   * it creates an identity otherwise.
   */
  readonly freshness: ViewFreshness = new ViewFreshness();

  /**
   * Starts listing at once.
   * @param ctx the backend's context
   * @param hooks what the session hears
   * @param signal ends the informer (the session's closing signal)
   */
  constructor(ctx: K8sContext, hooks: InformerHooks, signal: AbortSignal) {
    this.#ctx = ctx;
    this.#hooks = hooks;
    this.#signal = signal;
    this.#synced.promise.catch(() => {});
    this.done = this.#run().finally(() => {
      for (const queue of this.#subscribers) queue.end();
      this.#synced.reject(signal.reason);
    });
  }

  /** Whether the initial list is complete. */
  get synced(): boolean {
    return this.#isSynced;
  }

  /** Resolves once the initial list is complete; rejects when `signal` aborts first. */
  waitSynced(signal: AbortSignal): Promise<void> {
    return this.#isSynced ? Promise.resolve() : abortable(this.#synced.promise, signal);
  }

  /**
   * Every identity as `upsert` (once the initial list is complete), `synced`, then live changes,
   * until `signal` aborts or the session closes.
   */
  async *subscribe(signal: AbortSignal): AsyncGenerator<BackendEvent> {
    const queue = new EventQueue<BackendEvent>();
    if (this.#isSynced) this.#replay(queue);
    this.#subscribers.add(queue);
    const end = () => queue.end();
    signal.addEventListener("abort", end, { once: true });
    if (this.#signal.aborted) queue.end();
    try {
      yield* queue;
    } finally {
      signal.removeEventListener("abort", end);
      this.#subscribers.delete(queue);
    }
  }

  /**
   * Applies an identity object the session itself just wrote (create or patch) or read, unless
   * the watch delivered that version already (the index may hold a later one; `own_writes.ts`).
   * Subscribers see it as the watch would show it.
   */
  observe(obj: KubeObject): void {
    if (!this.#isSynced) return;
    const id = idOfName(obj.metadata?.name);
    if (id !== undefined && !this.#own.wrote(id, rvOf(obj), this.index.get(id)?.rv)) return;
    this.#apply(obj, Date.now());
  }

  #replay(queue: EventQueue<BackendEvent>): void {
    for (const r of this.index.records()) {
      queue.push({ type: "upsert", id: r.id, key: r.key, version: r.rv });
    }
    queue.push({ type: "synced" });
  }

  #emit(event: Change): void {
    if (!this.#isSynced) return;
    for (const queue of this.#subscribers) queue.push(event);
  }

  async #run(): Promise<void> {
    const { telemetry } = this.#ctx;
    const signal = this.#signal;
    /** Why the identities are listed next (`undefined`: they are not). */
    let relist: RelistReason | undefined = "initial";
    /** Failures in a row: the backoff's exponent. */
    let failures = 0;
    while (!signal.aborted) {
      try {
        if (relist !== undefined) {
          telemetry.relist(relist);
          await this.#list(relist === "initial" ? "cached" : "consistent");
          relist = undefined;
        }
        await this.#watch();
        failures = 0;
      } catch (err) {
        if (signal.aborted) return;
        this.freshness.lost();
        if (isStatus(err, 410)) {
          log.info("watch of identities expired at {rv}; re-listing", {
            rv: this.#resourceVersion,
          });
          relist = "expired";
          continue;
        }
        // A failed list or watch is tried again: a reconnect, as etcd's and Deno KV's feeds count.
        telemetry.reconnect(err);
        this.#hooks.onError(err);
        log.warning("watch of identities failed, resuming from {rv}: {err}", {
          rv: this.#resourceVersion,
          err: errorMessage(err),
        });
        try {
          // Jittered and capped as client-go's reflector: nodes that lost the server together do
          // not come back together, and a server that is down long is asked at most every 30 s.
          await sleep(backoffDelay(WATCH_BACKOFF, failures++), signal);
        } catch {
          return;
        }
      }
    }
  }

  /**
   * Lists every identity in one snapshot (from the watch cache, or `consistent`: paged from etcd)
   * and applies the difference to the index.
   */
  async #list(from: "cached" | "consistent"): Promise<void> {
    const { client, identities } = this.#ctx;
    const signal = this.#signal;
    const mark = this.#own.listing();
    const list = from === "cached"
      ? await client.list(identities, { resourceVersion: "0", signal })
      : await listAll(client, identities, { signal });
    this.#hooks.onSuccess();
    // This session's writes answered while the list was under way may be missing from it, or be
    // older than what it shows: there is no telling by their versions. They stay in the index and
    // are read again below.
    const during = this.#own.listed(mark);
    const listed = new Map<number, string>();
    for (const obj of list.items) {
      const id = this.#delivered(obj, undefined);
      if (id !== undefined) listed.set(id, rvOf(obj));
    }
    // What the index holds from before this snapshot and the snapshot lacks is gone.
    for (const r of [...this.index.records()]) {
      if (!listed.has(r.id) && !this.#own.holds(r.id)) this.#remove(r.id, undefined);
    }
    this.#resourceVersion = list.resourceVersion;
    for (const id of during) await this.#reread(id, listed.get(id));
    this.freshness.proven();
    if (!this.#isSynced) {
      this.#isSynced = true;
      for (const queue of this.#subscribers) this.#replay(queue);
      this.#synced.resolve();
    }
  }

  /** Watches from the current resource version until the stream ends. */
  async #watch(): Promise<void> {
    const { client, identities } = this.#ctx;
    const events = informerWatch(client, identities, this.#resourceVersion, this.#signal);
    for await (const event of events) {
      this.#hooks.onSuccess();
      this.freshness.proven();
      const rv = event.object?.metadata?.resourceVersion;
      const at = Date.now();
      if (event.type === "DELETED") {
        const id = idOfName(event.object.metadata.name);
        // A delete that comes before a write of this session the index holds (a re-creation seen
        // first) changes nothing.
        if (id !== undefined && this.#own.delivered(id, rv)) this.#remove(id, at);
        this.#damaged.delete(String(event.object.metadata.name ?? ""));
      } else if (event.type === "ADDED" || event.type === "MODIFIED") {
        this.#delivered(event.object, at);
      }
      if (typeof rv === "string" && rv !== "") this.#resourceVersion = rv;
    }
  }

  /**
   * Applies an object the watch or a list delivered, unless the index holds a write of this
   * session that comes after it. Returns the ID it accounts for (see `#apply`).
   */
  #delivered(obj: KubeObject, at: number | undefined): number | undefined {
    const id = idOfName(obj.metadata?.name);
    if (id !== undefined && !this.#own.delivered(id, rvOf(obj))) return id;
    return this.#apply(obj, at);
  }

  /**
   * Reads identity `id` again after a re-list that could not place this session's write of it
   * (see `#list`; `listedRv`: its version in the list). The read comes after the write, so it
   * shows it or a later version; one the list does not show yet, the watch from the list
   * delivers later, and its events before it are held back.
   */
  async #reread(id: number, listedRv: string | undefined): Promise<void> {
    const { client, identities } = this.#ctx;
    const obj = await client.get(identities, String(id), { signal: this.#signal });
    this.#own.settled(id);
    if (obj === undefined) return this.#remove(id, Date.now());
    if (rvOf(obj) !== listedRv) this.#own.wrote(id, rvOf(obj), undefined);
    this.#apply(obj, Date.now());
  }

  /**
   * Applies one object: the record when it is an identity at another version than the index's, a
   * removal when an ID the index holds became unreadable. Returns the ID it accounts for (damaged
   * objects count as seen: their ID is not "vanished", it is unreadable).
   */
  #apply(obj: KubeObject, at: number | undefined): number | undefined {
    const read = readIdentity(obj);
    if (!read.ok) {
      const { damage } = read;
      if (this.#damaged.get(damage.name) !== damage.rv) {
        this.#damaged.set(damage.name, damage.rv);
        log.warning("skipping identity {name}: {reason} (CorruptEntryError)", {
          name: damage.name,
          reason: damage.reason,
        });
      }
      if (damage.id !== undefined && this.index.get(damage.id) !== undefined) {
        this.#remove(damage.id, at);
      }
      return damage.id;
    }
    this.#damaged.delete(String(obj.metadata.name));
    const { record } = read;
    const known = this.index.get(record.id);
    if (known !== undefined && record.rv === known.rv) return record.id;
    this.index.set(record);
    this.#emit({
      type: "upsert",
      id: record.id,
      key: record.key,
      version: record.rv,
      ...(at === undefined ? {} : { at }),
    });
    this.#hooks.onRecord(record);
    return record.id;
  }

  #remove(id: number, at: number | undefined): void {
    if (this.index.delete(id) === undefined) return;
    this.#emit({ type: "delete", id, ...(at === undefined ? {} : { at }) });
  }
}
