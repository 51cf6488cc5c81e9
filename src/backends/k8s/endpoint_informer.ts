/**
 * GC's view of Cilium's endpoints: informers over `CiliumEndpoint`s (all namespaces) and
 * `CiliumEndpointSlice`s, as Cilium's operator keeps them, so that a GC pass does not list every
 * endpoint of the cluster (550,000 at 5,000 nodes of 110 pods). Each informer lists once, on the
 * first pass that asks, then watches from the list's resource version (bookmarks on, resumed from
 * the last version when the server ends the watch); `410 Gone` lists again. Passes after the first
 * read the index and send nothing.
 *
 * The index keeps what the rule needs and no object: per object its name and the IDs it names (one
 * number for an endpoint), per ID how many objects name it. The view it answers names users by
 * kind and count (`CiliumEndpoint ×2`); the doctor, which shows names, lists in full (`users.ts`).
 *
 * **What a pass trusts.** The index is as current as the watch: an event arrives milliseconds
 * after its write. While the watch is failing (a list or watch that errs, until an event arrives
 * again, or until the re-list after `410 Gone` completes), a pass does not trust it and lists that
 * resource in full, as before the informers; a connection that goes silent counts as failed after
 * `WATCH_IDLE_MS`, 2 minutes (the server sends a bookmark about every minute). This is the same
 * trust Cilium's operator gives its own informers, and an endpoint the watch shows late does not
 * endanger its identity: an identity is deleted only after it stayed marked for the grace
 * (Cilium's heartbeat timeout, 30 min), and the agent that made the endpoint acquired its
 * identity first, which removes the mark and refuses the guarded delete (`gc.ts`). A resource that
 * is not installed counts as none (Cilium installs `CiliumEndpointSlice`s only with CES enabled)
 * and is asked for again by a pass at most every {@linkcode MISSING_RECHECK_MS}, so a CRD
 * installed later is picked up well within the grace.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { EndpointIndex } from "./endpoint_informer.ts";
 *
 * const index = new EndpointIndex();
 * index.set("prod/web-1", [300]);
 * index.set("prod/web-2", [300]);
 * index.set("ces-1", [300, 301]);
 * assert.equal(index.count(300), 3);
 * index.delete("prod/web-1");
 * index.set("ces-1", [301]);
 * assert.deepEqual([index.count(300), index.count(301), index.count(302)], [1, 1, 0]);
 * ```
 *
 * @module
 */
import { sleep } from "../../abort.ts";
import { backoffDelay } from "../../allocator/backoff.ts";
import { errorMessage } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { ResourceNotInstalledError } from "./errors.ts";
import { isStatus, type KubeObject, type KubeResource, type Tally } from "./kube.ts";
import {
  endpointIdOf,
  endpointUsers,
  listEndpointObjects,
  sliceIdsOf,
  type UserIndex,
} from "./users.ts";
import { informerWatch, WATCH_BACKOFF } from "./watch.ts";

const log = idallocLogger("k8s", "gc");

/**
 * How long a pass trusts that a resource is not installed before it asks again (one 404): 5 min,
 * a sixth of the default grace, so a CRD installed later counts long before an identity its
 * objects name could be deleted (that needs a mark the grace old, and the agent that named it
 * removed the mark when it acquired the identity).
 */
export const MISSING_RECHECK_MS = 5 * 60_000;

/** The two kinds of Cilium object that keep an identity in use. */
export type EndpointKind = "CiliumEndpoint" | "CiliumEndpointSlice";

/** Object name → the IDs it names, and ID → how many objects name it. */
export class EndpointIndex {
  /** One number for the common case (an endpoint names one ID): no array per object. */
  readonly #byObject = new Map<string, number | readonly number[]>();
  readonly #counts = new Map<number, number>();

  /** How many objects it holds. */
  get size(): number {
    return this.#byObject.size;
  }

  /** How many objects name `id`. */
  count(id: number): number {
    return this.#counts.get(id) ?? 0;
  }

  /** Sets what object `name` names (`ids` without repeats); none removes it. */
  set(name: string, ids: readonly number[]): void {
    this.delete(name);
    if (ids.length === 0) return;
    this.#byObject.set(name, ids.length === 1 ? ids[0] : ids);
    for (const id of ids) this.#counts.set(id, this.count(id) + 1);
  }

  /** Forgets object `name`. */
  delete(name: string): void {
    const old = this.#byObject.get(name);
    if (old === undefined) return;
    this.#byObject.delete(name);
    for (const id of typeof old === "number" ? [old] : old) {
      const left = this.count(id) - 1;
      if (left > 0) this.#counts.set(id, left);
      else this.#counts.delete(id);
    }
  }

  /** Forgets everything. */
  clear(): void {
    this.#byObject.clear();
    this.#counts.clear();
  }
}

/** What {@linkcode EndpointInformer.current} found. */
export type EndpointRead =
  | { readonly state: "live"; readonly index: EndpointIndex }
  /** The resource is not installed: no users. */
  | { readonly state: "missing" }
  /** The watch is failing: list the resource in full for this pass. */
  | { readonly state: "stale" };

/** The informer of one endpoint resource (see the module doc). */
export class EndpointInformer {
  /** The resource it watches. */
  readonly resource: KubeResource;
  /** Which kind of object it holds. */
  readonly kind: EndpointKind;
  readonly #index = new EndpointIndex();
  readonly #ctx: K8sContext;
  readonly #signal: AbortSignal;
  readonly #spawn: (task: Promise<void>) => void;
  /** The watch loop, while it runs. */
  #loop: Promise<void> | undefined;
  /** The first list, while it runs (concurrent passes share it). */
  #starting: Promise<boolean> | undefined;
  #resourceVersion = "";
  /** Whether the index is current: a list completed and the watch has not failed since. */
  #healthy = false;
  /** When a list last found the resource not installed (own clock), if it did. */
  #missingSince: number | undefined;

  /**
   * @param ctx the backend's context
   * @param resource `CiliumEndpoint`s or `CiliumEndpointSlice`s
   * @param kind which of the two
   * @param signal ends the watch (the session's closing signal)
   * @param spawn tracks the watch loop (the session's task group)
   */
  constructor(
    ctx: K8sContext,
    resource: KubeResource,
    kind: EndpointKind,
    signal: AbortSignal,
    spawn: (task: Promise<void>) => void,
  ) {
    this.#ctx = ctx;
    this.resource = resource;
    this.kind = kind;
    this.#signal = signal;
    this.#spawn = spawn;
  }

  /**
   * The index, listing first if no watch runs (the first pass, or the resource was missing);
   * `missing` when the resource is not installed, `stale` while the watch is failing. A failed
   * first list throws (the pass fails, as a failed full list did).
   */
  async current(signal: AbortSignal, tally?: Tally): Promise<EndpointRead> {
    if (this.#loop === undefined) {
      const missing = this.#missingSince;
      if (missing !== undefined && this.#ctx.settings.now() - missing < MISSING_RECHECK_MS) {
        return { state: "missing" };
      }
      this.#starting ??= this.#list(signal, tally).finally(() => this.#starting = undefined);
      if (!await this.#starting) return { state: "missing" };
      if (this.#loop === undefined && !this.#signal.aborted) {
        this.#loop = this.#run();
        this.#spawn(this.#loop);
      }
    }
    return this.#healthy ? { state: "live", index: this.#index } : { state: "stale" };
  }

  /** The index while the watch runs and is current, without reading anything; else `undefined`. */
  peek(): EndpointIndex | undefined {
    return this.#loop !== undefined && this.#healthy ? this.#index : undefined;
  }

  /** The IDs `obj` names. */
  #idsOf(obj: KubeObject): number[] {
    if (this.kind === "CiliumEndpointSlice") return sliceIdsOf(obj);
    const id = endpointIdOf(obj);
    return id === undefined ? [] : [id];
  }

  /** The index's name of `obj`: `namespace/name` for a namespaced resource. */
  #nameOf(obj: KubeObject): string {
    const { namespace, name } = obj.metadata;
    return this.resource.namespaced ? `${namespace ?? ""}/${name ?? ""}` : String(name ?? "");
  }

  /** Lists every object into a fresh index; `false` when the resource is not installed. */
  async #list(signal: AbortSignal, tally?: Tally): Promise<boolean> {
    const list = await listEndpointObjects(this.#ctx, this.resource, signal, tally);
    this.#index.clear();
    if (list === undefined) {
      this.#healthy = false;
      this.#missingSince = this.#ctx.settings.now();
      return false;
    }
    this.#missingSince = undefined;
    for (const obj of list.items) this.#index.set(this.#nameOf(obj), this.#idsOf(obj));
    this.#resourceVersion = list.resourceVersion;
    this.#healthy = true;
    return true;
  }

  /** Watches until the session closes; ends (the next pass lists) when the resource goes. */
  async #run(): Promise<void> {
    const signal = this.#signal;
    let failures = 0;
    let relist = false;
    try {
      while (!signal.aborted) {
        try {
          if (relist) {
            if (!await this.#list(signal)) return;
            relist = false;
          }
          await this.#watch();
          failures = 0;
        } catch (err) {
          if (signal.aborted) return;
          this.#healthy = false;
          if (err instanceof ResourceNotInstalledError) {
            // Removed: the next pass asks again (and finds it gone, or back).
            return this.#index.clear();
          }
          if (isStatus(err, 410)) {
            log.info("watch of {resource} expired; listing again", { resource: this.kind });
            relist = true;
            continue;
          }
          log.warning("watch of {resource} failed; GC lists them until it is back: {err}", {
            resource: this.kind,
            err: errorMessage(err),
          });
          // Jittered and capped, as the identities' informer (`watch.ts`).
          await sleep(backoffDelay(WATCH_BACKOFF, failures++), signal).catch(() => {});
        }
      }
    } finally {
      this.#loop = undefined;
    }
  }

  /** Watches from the current resource version until the stream ends. */
  async #watch(): Promise<void> {
    const events = informerWatch(
      this.#ctx.client,
      this.resource,
      this.#resourceVersion,
      this.#signal,
    );
    for await (const event of events) {
      if (event.type === "DELETED") this.#index.delete(this.#nameOf(event.object));
      else if (event.type !== "BOOKMARK") {
        this.#index.set(this.#nameOf(event.object), this.#idsOf(event.object));
      }
      const rv = event.object.metadata.resourceVersion;
      if (typeof rv === "string" && rv !== "") this.#resourceVersion = rv;
      // Any event proves the stream works again after a failure.
      this.#healthy = true;
    }
  }
}

/** GC's endpoint and slice informers of one session (see the module doc). */
export class EndpointUsers {
  readonly #ctx: K8sContext;
  readonly #informers: EndpointInformer[] = [];

  /**
   * Creates the informers of the context's endpoint and slice resources; nothing is listed or
   * watched before the first {@linkcode EndpointUsers.read}.
   * @param ctx the backend's context
   * @param signal ends the watches (the session's closing signal)
   * @param spawn tracks the watch loops (the session's task group)
   */
  constructor(ctx: K8sContext, signal: AbortSignal, spawn: (task: Promise<void>) => void) {
    this.#ctx = ctx;
    if (ctx.endpoints !== undefined) {
      this.#informers.push(
        new EndpointInformer(ctx, ctx.endpoints, "CiliumEndpoint", signal, spawn),
      );
    }
    if (ctx.endpointSlices !== undefined) {
      this.#informers.push(
        new EndpointInformer(ctx, ctx.endpointSlices, "CiliumEndpointSlice", signal, spawn),
      );
    }
  }

  /** The informers (for tests). */
  get informers(): readonly EndpointInformer[] {
    return this.#informers;
  }

  /**
   * ID → the Cilium objects naming it, now: from each informer's index, or a full list of a
   * resource whose watch is failing. The first call lists (and starts the watches).
   */
  async read(signal: AbortSignal, tally?: Tally): Promise<UserIndex> {
    const parts: UserIndex[] = [];
    for (const informer of this.#informers) {
      const read = await informer.current(signal, tally);
      if (read.state === "live") parts.push(countView(read.index, informer.kind));
      else if (read.state === "stale") {
        const objects = (await listEndpointObjects(this.#ctx, informer.resource, signal, tally))
          ?.items ?? [];
        const slices = informer.kind === "CiliumEndpointSlice";
        parts.push(endpointUsers(slices ? [] : objects, slices ? objects : []));
      }
    }
    return {
      get(id) {
        const users = parts.flatMap((p) => p.get(id) ?? []);
        return users.length === 0 ? undefined : users;
      },
    };
  }
  /**
   * Whether a current informer names `id` now, reading nothing: the last look of a delete, for an
   * endpoint written after its pass read the users. An informer that is not current answers no
   * (the pass's own read, a full list then, stands).
   */
  namesNow(id: number): boolean {
    return this.#informers.some((informer) => (informer.peek()?.count(id) ?? 0) > 0);
  }
}

/** An index as a {@linkcode UserIndex}: `CiliumEndpoint ×2`. */
function countView(index: EndpointIndex, kind: EndpointKind): UserIndex {
  return {
    get(id) {
      const n = index.count(id);
      return n === 0 ? undefined : [n === 1 ? kind : `${kind} ×${n}`];
    },
  };
}
