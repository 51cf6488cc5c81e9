/**
 * `SessionDouble`: a plain in-memory test double of the `BackendSession` contract, for unit tests
 * of the allocator's parts (the cache feed, acquisition's retry policy, the re-check). It is not a
 * store: it keeps masters and this node's references in maps, answers `acquire`, `release` and
 * `ensure` by a script, and lets a test push watch events and move the claim's deadline. The
 * conformance suites cover the real stores.
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
  HeldKey,
  SessionStatus,
} from "../../src/allocator/backend.ts";
import { EventQueue } from "../../src/allocator/event_queue.ts";
import { abortable } from "../../src/abort.ts";
import { newerOrderedVersion } from "../../src/backends/shared/versions.ts";

/** A scripted `acquire` answer: a result, or an error to throw. */
export type AcquireStep = AcquireResult | Error;

/** A scripted `release` answer: an error to throw, or a gate to wait for before deleting. */
export type ReleaseStep = Error | Promise<unknown>;

/** The test double of a session (see the module doc). */
export class SessionDouble implements BackendSession {
  /** ID → key of the masters it knows. */
  readonly masters = new Map<number, string>();
  /** Keys this node references → ID. */
  readonly references = new Map<string, number>();
  /** Every call made, in order, as `name key/id`. */
  readonly calls: string[] = [];
  /** Answers of `acquire`, taken in order; when empty, it joins or creates like a store would. */
  readonly acquireSteps: AcquireStep[] = [];
  /** Answers of `release`, taken in order; when empty, it deletes at once. */
  readonly releaseSteps: ReleaseStep[] = [];
  /** The `acquire` requests seen. */
  readonly acquireRequests: AcquireRequest[] = [];
  /** What `ensure` answers for one held key; default: both present. */
  ensureReport: (held: HeldKey) => EnsureReport = (held) => ({
    ...held,
    master: "ok",
    reference: "ok",
  });
  /** The claim's deadline (`claimValidUntil`). */
  claimUntil = Number.POSITIVE_INFINITY;
  /** What `renew` does to the claim: by default it makes it valid for a minute. */
  onRenew: () => void = () => {
    this.claimUntil = Date.now() + 60_000;
  };
  readonly #watches = new Set<EventQueue<BackendEvent>>();
  #closed = false;

  /** Sends `event` to every open watch. */
  push(event: BackendEvent): void {
    for (const queue of this.#watches) queue.push(event);
  }

  /** Ends every open watch (as a broken connection would). */
  endWatches(): void {
    for (const queue of this.#watches) queue.end();
  }

  /** How many watches are open. */
  get watching(): number {
    return this.#watches.size;
  }

  acquire(request: AcquireRequest): Promise<AcquireResult> {
    this.calls.push(`acquire ${request.key}`);
    this.acquireRequests.push(request);
    const step = this.acquireSteps.shift();
    if (step instanceof Error) return Promise.reject(step);
    if (step) {
      this.references.set(request.key, step.id);
      return Promise.resolve(step);
    }
    for (const [id, key] of this.masters) {
      if (key === request.key) {
        this.references.set(request.key, id);
        return Promise.resolve({ id, created: false, version: "1" });
      }
    }
    const id = request.pickCandidate(new Set(this.masters.keys()));
    if (id === undefined) return Promise.reject(new Error("no candidate"));
    this.masters.set(id, request.key);
    this.references.set(request.key, id);
    return Promise.resolve({ id, created: true, version: "1" });
  }

  async release(key: string, id: number, signal: AbortSignal): Promise<void> {
    this.calls.push(`release ${key}/${id}`);
    const step = this.releaseSteps.shift();
    if (step instanceof Error) throw step;
    if (step) await abortable(step, signal);
    // The contract: the node's reference goes, whatever ID it holds.
    this.references.delete(key);
  }

  ensure(held: readonly HeldKey[]): Promise<EnsureReport[]> {
    this.calls.push(`ensure ${held.map((h) => h.key).join(",")}`);
    return Promise.resolve(held.map((h) => this.ensureReport(h)));
  }

  get(key: string): Promise<number | undefined> {
    for (const [id, k] of this.masters) if (k === key) return Promise.resolve(id);
    return Promise.resolve(undefined);
  }

  getById(id: number): Promise<string | undefined> {
    return Promise.resolve(this.masters.get(id));
  }

  async *watch(signal: AbortSignal): AsyncIterable<BackendEvent> {
    const queue = new EventQueue<BackendEvent>();
    for (const [id, key] of this.masters) queue.push({ type: "upsert", id, key, version: "1" });
    queue.push({ type: "synced" });
    this.#watches.add(queue);
    const end = () => queue.end();
    signal.addEventListener("abort", end, { once: true });
    try {
      yield* queue;
    } finally {
      signal.removeEventListener("abort", end);
      this.#watches.delete(queue);
    }
  }

  async *gcList(): AsyncIterable<GcCandidate> {}

  gcDelete(): Promise<boolean> {
    return Promise.resolve(false);
  }

  /** Versions ordered as etcd's mod revisions are. */
  newerVersion(a: string, b: string): boolean {
    return newerOrderedVersion(a, b);
  }

  claimValidUntil(): number {
    return this.claimUntil;
  }

  renew(): Promise<void> {
    this.calls.push("renew");
    this.onRenew();
    return Promise.resolve();
  }

  status(): SessionStatus {
    return {
      backend: "session-double",
      node: "n",
      endpoints: [],
      leases: 1,
      healthy: !this.#closed,
    };
  }

  close(): Promise<void> {
    this.#closed = true;
    this.endWatches();
    return Promise.resolve();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
