/**
 * The growth run's allocator, in its own process so its memory is its own: allocate/release cycles
 * over a key set with a sliding window of held keys and a GC pass every second, sampling memory
 * (after a forced V8 GC), the store's file size and the entries under the prefix every
 * `sampleEvery` cycles. Samples go to `samplesPath` as JSON lines; `done` on stdout at the end.
 *
 * `deno run -A --v8-flags=--expose-gc nemesis/growth_worker.ts '<GrowthConfig JSON>'`
 *
 * @module
 */
import { z } from "zod";
import { Allocator } from "../src/allocator/allocator.ts";
import type { GrowthSample, NemesisStore } from "../src/testing/nemesis.ts";
import { prng } from "../src/testing/prng.ts";
import { configFromArgs, logToStderr, openBackend, openStore } from "./process_support.ts";
import { storeSpecSchema, timingsSchema } from "./records.ts";

/** The growth allocator's configuration. */
export const growthConfigSchema = z.object({
  store: storeSpecSchema,
  cycles: z.number().int().positive(),
  sampleEvery: z.number().int().positive(),
  keys: z.number().int().positive(),
  /** Keys held at once: each cycle allocates one and releases the oldest. */
  window: z.number().int().positive(),
  /** Change-feed retention of the Deno KV backend, short so the run spans many retentions. */
  logRetentionMs: z.number().int().positive(),
  timings: timingsSchema,
  samplesPath: z.string().min(1),
  seed: z.number().int(),
});

/** The growth allocator's configuration. */
export type GrowthConfig = z.infer<typeof growthConfigSchema>;

/** Concurrent call loops of the one allocator. */
const LANES = 4;

async function main(): Promise<void> {
  const config = configFromArgs(growthConfigSchema);
  await logToStderr("warning");
  const gc = (globalThis as { gc?: () => void }).gc;
  if (!gc) throw new Error("run with --v8-flags=--expose-gc");
  const random = prng(config.seed);
  const keys = Array.from({ length: config.keys }, (_, i) => `k8s:growth=${i};`);
  const spec = config.store;
  await using opened = await openBackend(spec, "growth", { logRetentionMs: config.logRetentionMs });
  await using alloc = await Allocator.open(opened.backend, {
    min: 256,
    max: 256 + 2 * config.keys,
    leaseTtlMs: config.timings.leaseTtlMs,
    syncIntervalMs: config.timings.syncIntervalMs,
  });
  await using store: NemesisStore = await openStore(spec);
  const out = await Deno.open(config.samplesPath, { write: true, create: true, append: true });
  const encoder = new TextEncoder();

  // Change-feed entries written so far, per sample: the feed may legitimately hold those of its
  // retention window. (Counted by the store, not by this worker: master re-creations, repairs
  // and GC deletes write entries too, and no count of calls sees them all.)
  const written: { at: number; n: number }[] = [];
  // Entries expire after the retention, and a local file keeps expired rows about a minute more.
  const logWindowMs = config.logRetentionMs + 65_000;
  const closing = new AbortController();
  const gcLoop = (async () => {
    while (!closing.signal.aborted) {
      await new Promise((r) => setTimeout(r, config.timings.gcIntervalMs));
      if (closing.signal.aborted) break;
      try {
        await alloc.runGc({ signal: closing.signal });
      } catch {
        // A pass cut short by the end of the run.
      }
    }
  })();

  const start = Date.now();
  const sample = async (cycles: number) => {
    gc();
    const mem = Deno.memoryUsage();
    const now = Date.now();
    const counts = await store.counts();
    const total = counts["feed written"] ?? 0;
    // The newest earlier sample taken before the window began (none yet: everything counts).
    const before = written.findLast((w) => w.at <= now - logWindowMs)?.n ?? 0;
    written.push({ at: now, n: total });
    const s: GrowthSample = {
      cycles,
      elapsedMs: now - start,
      rss: mem.rss,
      heapUsed: mem.heapUsed,
      fileBytes: await store.fileBytes(),
      counts,
      recentChanges: total - before,
      logWindowMs,
    };
    await out.write(encoder.encode(JSON.stringify(s) + "\n"));
  };

  // A few lanes, each over its own slice of the keys with its own share of the window, so one
  // allocator sees concurrent calls without two of them racing on one key.
  let started = 0;
  let completed = 0;
  let nextSample = config.sampleEvery;
  let sampling: Promise<void> = Promise.resolve();
  await sample(0);
  await Promise.all(Array.from({ length: LANES }, async (_, lane) => {
    const mine = keys.filter((_, i) => i % LANES === lane);
    const held: string[] = [];
    while (started < config.cycles) {
      started++;
      const key = mine[Math.floor(random() * mine.length)];
      await alloc.allocate(key);
      held.push(key);
      if (held.length > config.window / LANES) await alloc.release(held.shift()!);
      completed++;
      if (completed >= nextSample && completed < config.cycles) {
        nextSample += config.sampleEvery;
        const at = completed;
        sampling = sampling.then(() => sample(at));
        await sampling;
      }
    }
  }));
  await sampling;
  await sample(completed);
  closing.abort();
  await gcLoop;
  out.close();
  console.log("done");
}

await main();
