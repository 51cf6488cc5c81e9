/**
 * What an allocator reports: allocations by outcome, their latency and store round trips, retries,
 * releases, GC passes, the watch's lag, spans for `allocate`, `release`, GC, the sync and the
 * initial sync, and its state (cache, held keys, free IDs, queues, health, the fence) as
 * observable instruments while it is open.
 *
 * A cached `allocate` costs one increment of a plain number ({@linkcode AllocatorTelemetry.cached}),
 * which the observable counter `idalloc.allocations` reports when the SDK collects: the hot path
 * never touches the OpenTelemetry API.
 *
 * @example Wrapping a call that goes to the store
 * ```ts
 * import assert from "node:assert/strict";
 * import { AllocatorTelemetry } from "./allocator.ts";
 * const telemetry = new AllocatorTelemetry({ backend: "deno-kv", prefix: "demo", node: "a" });
 * const result = await telemetry.allocation((trips) => {
 *   trips.count++; // one store round trip
 *   return Promise.resolve({ id: 7, isNew: true, firstUse: true });
 * });
 * assert.equal(result.id, 7);
 * assert.deepEqual(telemetry.counts(), { new: 1, existing: 0, cached: 0, failed: 0 });
 * ```
 *
 * @module
 */
import type { Attributes, Span } from "../deps/opentelemetry_api.ts";
import type { FenceStatus } from "../allocator/fence.ts";
import type { AllocateResult, GcStats, ReleaseResult } from "../allocator/types.ts";
import { ATTR } from "./catalog.ts";
import {
  AttributeSets,
  endSpan,
  errorType,
  inSpan,
  instruments,
  type ObservationSink,
  type ObservationSource,
  observe,
  tracer,
} from "./instruments.ts";

/** Who an allocator is, for the attributes of everything it reports. */
export interface AllocatorIdentity {
  /** Backend kind. */
  readonly backend: string;
  /** The namespace as an operator writes it. */
  readonly prefix: string;
  /** The node name. */
  readonly node: string;
}

/** Backend kind, namespace (as its admin view names it) and node of `backend`. */
export function identityOf(
  backend: {
    readonly kind: string;
    readonly node: string;
    admin(): { readonly namespace: string };
  },
): AllocatorIdentity {
  let prefix = "";
  try {
    prefix = backend.admin().namespace;
  } catch {
    // A backend without an admin view still reports, without its namespace.
  }
  return { backend: backend.kind, prefix, node: backend.node };
}

/** An allocator's state as the observable instruments report it. */
export interface AllocatorGauges {
  /** Keys held. */
  readonly heldKeys: number;
  /** IDs in the cache. */
  readonly cachedIds: number;
  /** Free IDs in range. */
  readonly availableIds: number;
  /** Events queued for `watch()` consumers. */
  readonly queuedEvents: number;
  /** `status().healthy`. */
  readonly healthy: boolean;
  /** The fence's counters. */
  readonly fence: FenceStatus;
}

/** Allocation counts by outcome (what `idalloc.allocations` reports). */
export interface AllocationCounts {
  /** IDs this node created. */
  readonly new: number;
  /** IDs the store already had. */
  readonly existing: number;
  /** Keys already held here. */
  readonly cached: number;
  /** Failed calls. */
  readonly failed: number;
}

/** Whether the allocator could not delete the reference at once (the sync retries it). */
export interface ReleaseNote {
  /** Set when the delete failed and was left to the sync. */
  deferred: boolean;
}

/** The telemetry of one allocator. */
export class AllocatorTelemetry implements ObservationSource {
  /**
   * Allocations answered from memory (a key held here). Incremented on the hot path and read by
   * the observable counter; a plain field so that the increment is all it costs.
   */
  cached = 0;
  #new = 0;
  #existing = 0;
  readonly #failed = new Map<string, number>();
  readonly #sets: AttributeSets;
  #gauges: (() => AllocatorGauges) | undefined;
  #registration: Disposable | undefined;
  #initial: Span | undefined;

  /** @param identity backend, namespace and node of the allocator */
  constructor(identity: AllocatorIdentity) {
    this.#sets = new AttributeSets({
      [ATTR.backend]: identity.backend,
      [ATTR.prefix]: identity.prefix,
      [ATTR.node]: identity.node,
    });
  }

  /**
   * Starts reporting `gauges` (and the allocation counts) through the observable instruments, and
   * the `idalloc.initial_sync` span.
   */
  open(gauges: () => AllocatorGauges): void {
    this.#gauges = gauges;
    this.#registration = observe(this);
    this.#initial = tracer().startSpan("idalloc.initial_sync", { attributes: this.#sets.base });
  }

  /** The initial list is in the cache. */
  synced(): void {
    if (this.#initial) endSpan(this.#initial, "ok");
    this.#initial = undefined;
  }

  /** Stops reporting; an initial sync still under way ends as `cancelled`. */
  close(): void {
    this.#registration?.[Symbol.dispose]();
    this.#registration = undefined;
    if (this.#initial) endSpan(this.#initial, "cancelled");
    this.#initial = undefined;
  }

  /**
   * The store's change events, unchanged. Until the initial sync completes, each step runs inside
   * the `idalloc.initial_sync` span, so the initial list's round trips are its children; every
   * change that carries its time is measured for `idalloc.watch.lag` once the consumer applied it.
   */
  async *watched<E extends { readonly type: string; readonly at?: number }>(
    events: AsyncIterable<E>,
  ): AsyncGenerator<E> {
    const iterator = events[Symbol.asyncIterator]();
    try {
      for (;;) {
        const span = this.#initial;
        const step = span ? await inSpan(span, () => iterator.next()) : await iterator.next();
        if (step.done) return;
        yield step.value;
        const at = step.value.at;
        if (at !== undefined) {
          instruments().watchLag.record(Math.max(0, Date.now() - at) / 1000, this.#sets.base);
        }
      }
    } finally {
      await iterator.return?.();
    }
  }

  /** The allocator's own watch failed with `err` and is restarted. */
  reconnect(err: unknown): void {
    const type = errorType(err);
    instruments().reconnects.add(
      1,
      this.#sets.get(`c\0${type}`, () => ({ [ATTR.errorType]: type })),
    );
  }

  /** An `allocate` failed before it could reach the store (closed, bad key). */
  failed(err: unknown): void {
    const type = errorType(err);
    this.#failed.set(type, (this.#failed.get(type) ?? 0) + 1);
  }

  /**
   * Runs an `allocate` that goes to the store inside the `idalloc.allocate` span, and records its
   * outcome, duration and round trips (`run` passes `trips` on to the session).
   */
  async allocation(
    run: (trips: { count: number }) => Promise<AllocateResult>,
  ): Promise<AllocateResult> {
    const span = tracer().startSpan("idalloc.allocate", { attributes: this.#sets.base });
    const started = performance.now();
    const trips = { count: 0 };
    let result: AllocateResult;
    try {
      result = await inSpan(span, () => run(trips));
    } catch (err) {
      this.failed(err);
      this.#recordAllocation("failed", err, started, trips.count);
      endSpan(span, "failed", err);
      throw err;
    }
    // A key another call took meanwhile (or the fence re-checked) needed no store access.
    const outcome = !result.firstUse ? "cached" : result.isNew ? "new" : "existing";
    if (outcome === "new") this.#new++;
    else if (outcome === "existing") this.#existing++;
    else this.cached++;
    this.#recordAllocation(outcome, undefined, started, trips.count);
    if (span.isRecording()) span.setAttribute("idalloc.id", result.id);
    endSpan(span, outcome);
    return result;
  }

  #recordAllocation(outcome: string, err: unknown, started: number, trips: number): void {
    const inst = instruments();
    const type = err === undefined ? "" : errorType(err);
    inst.allocationDuration.record(
      (performance.now() - started) / 1000,
      this.#sets.get(`a\0${outcome}\0${type}`, () => ({
        [ATTR.outcome]: outcome,
        ...(type ? { [ATTR.errorType]: type } : {}),
      })),
    );
    if (outcome !== "cached") {
      inst.allocationRoundTrips.record(
        trips,
        this.#sets.get(`o\0${outcome}`, () => ({ [ATTR.outcome]: outcome })),
      );
    }
  }

  /** One attempt of an `allocate` failed with `err` and will be tried again. */
  retry(err: unknown): void {
    const type = errorType(err);
    instruments().allocationRetries.add(
      1,
      this.#sets.get(`x\0${type}`, () => ({ [ATTR.errorType]: type })),
    );
  }

  /** Runs a `release` inside the `idalloc.release` span and records its outcome and duration. */
  async release(run: (note: ReleaseNote) => Promise<ReleaseResult>): Promise<ReleaseResult> {
    const span = tracer().startSpan("idalloc.release", { attributes: this.#sets.base });
    const started = performance.now();
    const note: ReleaseNote = { deferred: false };
    let outcome = "failed";
    let failure: unknown;
    try {
      const result = await inSpan(span, () => run(note));
      outcome = !result.lastUse ? "held" : note.deferred ? "deferred" : "last_use";
      return result;
    } catch (err) {
      failure = err;
      throw err;
    } finally {
      const inst = instruments();
      const type = failure === undefined ? "" : errorType(failure);
      inst.releases.add(
        1,
        this.#sets.get(`r\0${outcome}\0${type}`, () => ({
          [ATTR.outcome]: outcome,
          ...(type ? { [ATTR.errorType]: type } : {}),
        })),
      );
      inst.releaseDuration.record(
        (performance.now() - started) / 1000,
        this.#sets.get(`o\0${outcome}`, () => ({ [ATTR.outcome]: outcome })),
      );
      endSpan(span, outcome, failure);
    }
  }

  /** Runs one GC pass inside the `idalloc.gc` span and records what it did. */
  async gc(run: () => Promise<GcStats>): Promise<GcStats> {
    const span = tracer().startSpan("idalloc.gc", { attributes: this.#sets.base });
    const started = performance.now();
    const inst = instruments();
    let stats: GcStats;
    try {
      stats = await inSpan(span, run);
    } catch (err) {
      const type = errorType(err);
      inst.gcRuns.add(
        1,
        this.#sets.get(`g\0failed\0${type}`, () => ({
          [ATTR.outcome]: "failed",
          [ATTR.errorType]: type,
        })),
      );
      inst.gcDuration.record((performance.now() - started) / 1000, this.#outcome("failed"));
      endSpan(span, "failed", err);
      throw err;
    }
    inst.gcRuns.add(1, this.#outcome("ok"));
    inst.gcDuration.record((performance.now() - started) / 1000, this.#outcome("ok"));
    for (
      const [result, n] of [
        ["marked", stats.marked],
        ["deleted", stats.deleted],
        ["skipped", stats.skipped],
      ] as const
    ) {
      if (n > 0) {
        inst.gcIds.add(n, this.#sets.get(`gi\0${result}`, () => ({ [ATTR.gcResult]: result })));
      }
    }
    if (span.isRecording()) {
      span.setAttributes({
        "idalloc.gc.deleted": stats.deleted,
        "idalloc.gc.marked": stats.marked,
        "idalloc.gc.skipped": stats.skipped,
      });
    }
    endSpan(span, "ok");
    return stats;
  }

  /** Runs one re-check of the held keys (`reason`) inside the `idalloc.sync` span. */
  async sync(reason: string, keys: number, run: () => Promise<void>): Promise<void> {
    const span = tracer().startSpan("idalloc.sync", {
      attributes: { ...this.#sets.base, [ATTR.reason]: reason, "idalloc.keys": keys },
    });
    try {
      await inSpan(span, run);
    } catch (err) {
      endSpan(span, "failed", err);
      throw err;
    }
    endSpan(span, "ok");
  }

  #outcome(outcome: string): Attributes {
    return this.#sets.get(`o\0${outcome}`, () => ({ [ATTR.outcome]: outcome }));
  }

  /** Allocation counts so far. */
  counts(): AllocationCounts {
    let failed = 0;
    for (const n of this.#failed.values()) failed += n;
    return { new: this.#new, existing: this.#existing, cached: this.cached, failed };
  }

  /** See {@linkcode ObservationSource.observe}. */
  observe(sink: ObservationSink): void {
    const sets = this.#sets;
    sink.add("idalloc.allocations", this.#new, this.#outcome("new"));
    sink.add("idalloc.allocations", this.#existing, this.#outcome("existing"));
    sink.add("idalloc.allocations", this.cached, this.#outcome("cached"));
    for (const [type, n] of this.#failed) {
      sink.add(
        "idalloc.allocations",
        n,
        sets.get(`f\0${type}`, () => ({ [ATTR.outcome]: "failed", [ATTR.errorType]: type })),
      );
    }
    const gauges = this.#gauges?.();
    if (!gauges) return;
    const base = sets.base;
    sink.add("idalloc.cache.ids", gauges.cachedIds, base);
    sink.add("idalloc.keys.held", gauges.heldKeys, base);
    sink.add("idalloc.ids.free", gauges.availableIds, base);
    sink.add("idalloc.subscriber.queue", gauges.queuedEvents, base);
    sink.add("idalloc.healthy", gauges.healthy ? 1 : 0, base);
    const { fence } = gauges;
    sink.add("idalloc.lease.lapses", fence.lapses, base);
    sink.add("idalloc.lease.replacements", fence.replacements, base);
    sink.add("idalloc.fence.conflicts", fence.conflicts, base);
    sink.add("idalloc.keys.reassigned", fence.reassigned, base);
    sink.add("idalloc.keys.fenced", fence.all ? gauges.heldKeys : fence.suspectKeys, base);
  }
}
