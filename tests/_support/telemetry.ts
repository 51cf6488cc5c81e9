/**
 * An OpenTelemetry SDK for tests, installed as the global providers: a metric reader collected on
 * demand (sdk-metrics) and the trace SDK's in-memory span exporter, with an AsyncLocalStorage
 * context manager so child spans find their parents. Global providers are process-wide: use it
 * only in test files of their own, and dispose it (which disables the globals) after each test.
 *
 * @example
 * ```ts ignore
 * // Installs a global OpenTelemetry SDK; tests/telemetry/ runs it.
 * await using sdk = installSdk();
 * // … exercise idalloc …
 * const metrics = await sdk.collect();
 * console.log(sum(metrics, "idalloc.allocations", { "idalloc.outcome": "new" }));
 * ```
 *
 * @module
 */
import { type Attributes, context, metrics, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import {
  AggregationTemporality,
  type DataPoint,
  type Histogram,
  MeterProvider,
  MetricReader,
  type ResourceMetrics,
} from "@opentelemetry/sdk-metrics";
import {
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
  TracerProvider,
} from "@opentelemetry/sdk-trace";

/** A reader that exports nowhere: tests call `collect()`. */
class CollectingReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE });
  }
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/** One data point of a collected metric, flattened. */
export interface Point {
  /** The metric's name. */
  readonly name: string;
  /** Its attributes. */
  readonly attributes: Attributes;
  /** A counter's or gauge's value; a histogram's count. */
  readonly value: number;
  /** A histogram's sum (undefined otherwise). */
  readonly sum?: number;
}

/** An installed SDK; disposing it shuts it down and disables the global providers. */
export interface TestSdk extends AsyncDisposable {
  /** Every data point collected now. */
  collect(): Promise<Point[]>;
  /** Every span ended so far. */
  spans(): ReadableSpan[];
}

/** Installs the SDK as the global meter and tracer providers (and a context manager). */
export function installSdk(): TestSdk {
  const reader = new CollectingReader();
  const meterProvider = new MeterProvider({ readers: [reader] });
  const exporter = new InMemorySpanExporter();
  const tracerProvider = new TracerProvider({
    spanProcessors: [new SimpleSpanProcessor({ exporter })],
  });
  const contextManager = new AsyncLocalStorageContextManager().enable();
  context.setGlobalContextManager(contextManager);
  metrics.setGlobalMeterProvider(meterProvider);
  trace.setGlobalTracerProvider(tracerProvider);
  let disposed = false;
  return {
    async collect() {
      const { resourceMetrics, errors } = await reader.collect();
      if (errors.length > 0) throw new AggregateError(errors, "metric collection failed");
      return flatten(resourceMetrics);
    },
    spans: () => exporter.getFinishedSpans(),
    async [Symbol.asyncDispose]() {
      if (disposed) return;
      disposed = true;
      metrics.disable();
      trace.disable();
      context.disable();
      await meterProvider.shutdown();
      await tracerProvider.shutdown();
    },
  };
}

function flatten(resourceMetrics: ResourceMetrics): Point[] {
  const out: Point[] = [];
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) {
      for (const point of metric.dataPoints as DataPoint<number | Histogram>[]) {
        const v = point.value;
        out.push(
          typeof v === "number"
            ? { name: metric.descriptor.name, attributes: point.attributes, value: v }
            : {
              name: metric.descriptor.name,
              attributes: point.attributes,
              value: v.count,
              sum: v.sum,
            },
        );
      }
    }
  }
  return out;
}

/** The points of `name` whose attributes include `match`. */
export function points(all: readonly Point[], name: string, match: Attributes = {}): Point[] {
  return all.filter((p) =>
    p.name === name && Object.entries(match).every(([k, v]) => p.attributes[k] === v)
  );
}

/** The sum of the values (histograms: counts) of `name` matching `match`. */
export function sum(all: readonly Point[], name: string, match: Attributes = {}): number {
  return points(all, name, match).reduce((n, p) => n + p.value, 0);
}

/** The spans named `name`. */
export function spansNamed(spans: readonly ReadableSpan[], name: string): ReadableSpan[] {
  return spans.filter((s) => s.name === name);
}

/** The spans whose parent is `parent`. */
export function childrenOf(spans: readonly ReadableSpan[], parent: ReadableSpan): ReadableSpan[] {
  const id = parent.spanContext().spanId;
  return spans.filter((s) => s.parentSpanContext?.spanId === id);
}
