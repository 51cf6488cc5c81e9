/**
 * The cost of the OpenTelemetry instrumentation: cached `allocate` and new-key allocations on a
 * Deno KV file, first with no provider installed (the API's no-ops), then with the SDK installed as
 * the global providers (a metric reader collected at the end, every span kept in memory).
 * `deno task bench telemetry`; `deno run -A bench/telemetry.ts [rounds]` alone.
 *
 * @module
 */
import { context, metrics, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { MeterProvider, MetricReader } from "@opentelemetry/sdk-metrics";
import {
  InMemorySpanExporter,
  SimpleSpanProcessor,
  TracerProvider,
} from "@opentelemetry/sdk-trace";
import { Allocator, DenoKvBackend } from "../mod.ts";
import { type BenchRow, fmt, rate } from "./_table.ts";

class Reader extends MetricReader {
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/** Cached and new-key allocations per second on a fresh prefix of `kv`. */
async function measure(
  kv: Deno.Kv,
  run: string,
  keys: number,
  cachedCalls: number,
): Promise<{ cached: number; newKeys: number }> {
  const backend = new DenoKvBackend(kv, { prefix: ["bench-telemetry", run], node: "a" });
  await using alloc = await Allocator.open(backend, { max: 1_000_000 });
  await alloc.waitForInitialSync();
  const newKeys = await rate(keys, 1, (i) => alloc.allocate(`key-${i}`));
  await rate(cachedCalls / 10, 1, () => alloc.allocate("key-1")); // warm-up
  const cached = await rate(cachedCalls, 1, () => alloc.allocate("key-1"));
  return { cached, newKeys };
}

/** Runs `rounds` alternations of no provider / SDK installed; returns table rows (ranges). */
export async function benchTelemetry(rounds = 3, keys = 2_000, cachedCalls = 2_000_000): Promise<
  BenchRow[]
> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-bench-telemetry-" });
  type Rates = { cached: number; newKeys: number };
  const results: { none: Rates[]; sdk: Rates[] } = { none: [], sdk: [] };
  try {
    using kv = await Deno.openKv(`${dir}/bench.kv`);
    await measure(kv, "warm-up", keys, cachedCalls / 10); // the file's first writes are slow
    for (let round = 0; round < rounds; round++) {
      results.none.push(await measure(kv, `none-${round}`, keys, cachedCalls));
      const reader = new Reader();
      const meterProvider = new MeterProvider({ readers: [reader] });
      const exporter = new InMemorySpanExporter();
      const tracerProvider = new TracerProvider({
        spanProcessors: [new SimpleSpanProcessor({ exporter })],
      });
      context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
      metrics.setGlobalMeterProvider(meterProvider);
      trace.setGlobalTracerProvider(tracerProvider);
      try {
        results.sdk.push(await measure(kv, `sdk-${round}`, keys, cachedCalls));
        await reader.collect();
      } finally {
        metrics.disable();
        trace.disable();
        context.disable();
        await meterProvider.shutdown();
        await tracerProvider.shutdown();
      }
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  const range = (xs: number[]) => `${fmt(Math.min(...xs))} – ${fmt(Math.max(...xs))}`;
  return [
    { name: "cached allocate/s, no provider", value: range(results.none.map((r) => r.cached)) },
    { name: "cached allocate/s, SDK installed", value: range(results.sdk.map((r) => r.cached)) },
    {
      name: "KV new-key allocations/s, no provider",
      value: range(results.none.map((r) => r.newKeys)),
    },
    {
      name: "KV new-key allocations/s, SDK installed",
      value: range(results.sdk.map((r) => r.newKeys)),
    },
  ];
}

if (import.meta.main) console.table(await benchTelemetry(Number(Deno.args[0] ?? 3)));
