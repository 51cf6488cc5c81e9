/**
 * The OpenTelemetry instruments of idalloc, through `@opentelemetry/api` alone: the library never
 * starts an SDK and configures nothing. Whatever `MeterProvider` and `TracerProvider` the
 * application installed globally (its own SDK, or Deno's built-in one with `OTEL_DENO=true`) picks
 * the signals up; with none, every instrument is the API's no-op.
 *
 * The meter is resolved lazily and again whenever the global provider changes, so an application
 * that installs its provider after importing idalloc (or after opening an allocator) still gets
 * everything: the next store operation, lease renewal or slow-path call rebuilds the instruments.
 * Hot paths never look the provider up (a cached `allocate` increments a plain number that an
 * observable counter reports).
 *
 * @example Count what an allocator does with a meter provider the application installed
 * ```ts ignore
 * // ignored: needs an SDK reader of your choice (`docs/observability.md` shows one)
 * import { metrics } from "@opentelemetry/api";
 * import { MeterProvider } from "@opentelemetry/sdk-metrics";
 * metrics.setGlobalMeterProvider(new MeterProvider({ readers: [reader] }));
 * // idalloc's allocators now report `idalloc.allocations`, `idalloc.store.operations`, …
 * ```
 *
 * @module
 */
import {
  type Attributes,
  type BatchObservableResult,
  type Context,
  context,
  type Counter,
  type Histogram,
  type Meter,
  type MeterProvider,
  metrics,
  type Observable,
  type Span,
  SpanStatusCode,
  trace,
  type Tracer,
  type TracerProvider,
} from "../deps/opentelemetry_api.ts";
import denoJson from "../../deno.json" with { type: "json" };
import { idallocLogger } from "../log.ts";
import { METRICS } from "./catalog.ts";
import { errorMessage } from "../errors.ts";

const log = idallocLogger("telemetry");

/** The instrumentation scope name. */
export const SCOPE = "idalloc";
/** The instrumentation scope version: idalloc's own. */
export const VERSION: string = denoJson.version;

/** The synchronous instruments, by role. */
export interface Instruments {
  readonly allocationDuration: Histogram;
  readonly allocationRoundTrips: Histogram;
  readonly allocationRetries: Counter;
  readonly releases: Counter;
  readonly releaseDuration: Histogram;
  readonly storeOperations: Counter;
  readonly storeDuration: Histogram;
  readonly storeRetries: Counter;
  readonly batchSize: Histogram;
  readonly watchLag: Histogram;
  readonly relists: Counter;
  readonly reconnects: Counter;
  readonly gcRuns: Counter;
  readonly gcIds: Counter;
  readonly gcDuration: Histogram;
  readonly renewals: Counter;
}

const SYNC: Readonly<Record<keyof Instruments, string>> = {
  allocationDuration: "idalloc.allocation.duration",
  allocationRoundTrips: "idalloc.allocation.round_trips",
  allocationRetries: "idalloc.allocation.retries",
  releases: "idalloc.releases",
  releaseDuration: "idalloc.release.duration",
  storeOperations: "idalloc.store.operations",
  storeDuration: "idalloc.store.operation.duration",
  storeRetries: "idalloc.store.retries",
  batchSize: "idalloc.store.batch.size",
  watchLag: "idalloc.watch.lag",
  relists: "idalloc.watch.relists",
  reconnects: "idalloc.watch.reconnects",
  gcRuns: "idalloc.gc.runs",
  gcIds: "idalloc.gc.ids",
  gcDuration: "idalloc.gc.duration",
  renewals: "idalloc.lease.renewals",
};

/** The observable instruments, reported from live sources when the SDK collects. */
export type ObservableName =
  | "idalloc.allocations"
  | "idalloc.cache.ids"
  | "idalloc.keys.held"
  | "idalloc.ids.free"
  | "idalloc.subscriber.queue"
  | "idalloc.healthy"
  | "idalloc.lease.lapses"
  | "idalloc.lease.replacements"
  | "idalloc.fence.conflicts"
  | "idalloc.keys.reassigned"
  | "idalloc.keys.fenced"
  | "idalloc.identities"
  | "idalloc.identity.kvstore.total_count"
  | "idalloc.identity.kvstore.only_count"
  | "idalloc.identity.crd.total_count"
  | "idalloc.identity.crd.only_count"
  | "idalloc.identity.differing_count";

/** Where a source reports its current values; values of equal attribute sets add up. */
export interface ObservationSink {
  /** Reports `value` for `name` with `attributes` (a frozen, reused object). */
  add(name: ObservableName, value: number, attributes: Attributes): void;
}

/** Something live (an allocator, an identity allocator) whose state observable instruments report. */
export interface ObservationSource {
  /** Reports the current values. Called at every collection while registered. */
  observe(sink: ObservationSink): void;
}

interface Built {
  readonly provider: MeterProvider;
  readonly meter: Meter;
  readonly instruments: Instruments;
  readonly observables: ReadonlyMap<string, Observable>;
}

let built: Built | undefined;
const sources = new Set<ObservationSource>();
let tracerProvider: TracerProvider | undefined;
let cachedTracer: Tracer | undefined;

function build(provider: MeterProvider): Built {
  const meter = provider.getMeter(SCOPE, VERSION);
  const byName = new Map<string, Counter | Histogram>();
  const observables = new Map<string, Observable>();
  for (const spec of METRICS) {
    const options = { description: spec.description, unit: spec.unit };
    switch (spec.kind) {
      case "counter":
        byName.set(spec.name, meter.createCounter(spec.name, options));
        break;
      case "histogram":
        byName.set(
          spec.name,
          meter.createHistogram(spec.name, {
            ...options,
            advice: spec.buckets ? { explicitBucketBoundaries: [...spec.buckets] } : undefined,
          }),
        );
        break;
      case "observable-counter":
        observables.set(spec.name, meter.createObservableCounter(spec.name, options));
        break;
      case "observable-gauge":
        observables.set(spec.name, meter.createObservableGauge(spec.name, options));
        break;
    }
  }
  const instruments = Object.fromEntries(
    Object.entries(SYNC).map(([role, name]) => [role, byName.get(name)]),
  ) as unknown as Instruments;
  meter.addBatchObservableCallback(collect, [...observables.values()]);
  return { provider, meter, instruments, observables };
}

/**
 * The instruments of the current global meter provider, rebuilt when it changed. Cheap (one
 * global lookup) but not free: call it on slow paths only.
 */
export function instruments(): Instruments {
  const provider = metrics.getMeterProvider();
  if (built?.provider !== provider) {
    const old = built;
    built = build(provider);
    // The old provider may live on (tests swap providers): it must not report our sources twice.
    if (old) old.meter.removeBatchObservableCallback(collect, [...old.observables.values()]);
  }
  return built.instruments;
}

function collect(result: BatchObservableResult): void {
  const observables = built?.observables;
  if (!observables) return;
  const sums = new Map<string, Map<Attributes, number>>();
  const byKey = new Map<string, Attributes>();
  const sink: ObservationSink = {
    add(name, value, attributes) {
      let perName = sums.get(name);
      if (!perName) sums.set(name, perName = new Map());
      // Equal attribute sets from different sources (two allocators of one node) add up.
      const key = attributeKey(attributes);
      const canonical = byKey.get(key) ?? attributes;
      byKey.set(key, canonical);
      perName.set(canonical, (perName.get(canonical) ?? 0) + value);
    },
  };
  for (const source of sources) {
    try {
      source.observe(sink);
    } catch (err) {
      log.warning("a telemetry source failed to report: {err}", { err });
    }
  }
  for (const [name, perName] of sums) {
    const observable = observables.get(name);
    if (!observable) continue;
    for (const [attributes, value] of perName) result.observe(observable, value, attributes);
  }
}

const keys = new WeakMap<Attributes, string>();

function attributeKey(attributes: Attributes): string {
  let key = keys.get(attributes);
  if (key === undefined) {
    key = JSON.stringify(Object.entries(attributes).sort(([a], [b]) => (a < b ? -1 : 1)));
    keys.set(attributes, key);
  }
  return key;
}

/**
 * Registers `source` with the observable instruments until the returned disposable is disposed
 * (an allocator's `close()`).
 */
export function observe(source: ObservationSource): Disposable {
  sources.add(source);
  instruments();
  return { [Symbol.dispose]: () => void sources.delete(source) };
}

/** The tracer of the current global tracer provider. */
export function tracer(): Tracer {
  const provider = trace.getTracerProvider();
  if (provider !== tracerProvider || cachedTracer === undefined) {
    tracerProvider = provider;
    cachedTracer = provider.getTracer(SCOPE, VERSION);
  }
  return cachedTracer;
}

/** The class name of a thrown value (`StoreUnavailableError`, `TimeoutError`, …). */
export function errorType(err: unknown): string {
  if (typeof err === "object" && err !== null && "name" in err && typeof err.name === "string") {
    return err.name;
  }
  return typeof err;
}

/** Runs `fn` with `span` as the active span (child spans of store round trips attach to it). */
export function inSpan<T>(span: Span, fn: () => Promise<T>): Promise<T> {
  return context.with(trace.setSpan(context.active(), span), fn);
}

/** Ends `span` with its outcome; a failure also sets the error status and `error.type`. */
export function endSpan(span: Span, outcome: string, err?: unknown): void {
  if (!span.isRecording()) return void span.end();
  span.setAttribute("idalloc.outcome", outcome);
  if (err !== undefined) {
    span.setAttribute("error.type", errorType(err));
    span.setStatus({
      code: SpanStatusCode.ERROR,
      message: errorMessage(err),
    });
  }
  span.end();
}

/** Whether a store round trip made now has a parent span to attach to. */
export function parentRecording(): boolean {
  return trace.getSpan(context.active())?.isRecording() === true;
}

/**
 * Frozen attribute sets derived from one base set, made once per distinct key and reused, so that
 * recording a measurement allocates nothing.
 */
export class AttributeSets {
  /** The base attributes (backend, prefix, node). */
  readonly base: Attributes;
  readonly #cache = new Map<string, Attributes>();

  /** @param base the attributes every derived set carries */
  constructor(base: Attributes) {
    this.base = Object.freeze({ ...base });
  }

  /**
   * The base plus `extra`, cached under `key` (which must determine `extra`). `extra` is only
   * called the first time.
   */
  get(key: string, extra: () => Attributes): Attributes {
    let attributes = this.#cache.get(key);
    if (attributes === undefined) {
      attributes = Object.freeze({ ...this.base, ...extra() });
      this.#cache.set(key, attributes);
    }
    return attributes;
  }
}

/** The active telemetry context, to hand to work that runs later on someone's behalf. */
export function captureContext(): Context {
  return context.active();
}

/**
 * Runs `fn` in a captured context: a shared store request (group commit) runs in its first
 * member's, so its round trip is traced under that member's span.
 */
export function withContext<T>(captured: Context, fn: () => Promise<T>): Promise<T> {
  return context.with(captured, fn);
}
