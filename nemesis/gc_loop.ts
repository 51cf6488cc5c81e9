/**
 * The nemesis GC loop: its own node, in its own process, running one GC pass every
 * `gcIntervalMs` over the whole range for the entire run (Cilium's operator), and logging each
 * pass (what it deleted) as a JSON line. `stop` on stdin closes it.
 *
 * `deno run -A nemesis/gc_loop.ts '<GcConfig JSON>'`
 *
 * @module
 */
import { Allocator } from "../src/allocator/allocator.ts";
import { sleep } from "../src/abort.ts";
import {
  configFromArgs,
  logToStderr,
  openBackend,
  startWhenReachable,
  stdinLines,
} from "./process_support.ts";
import { gcConfigSchema, LineLog } from "./records.ts";

const config = configFromArgs(gcConfigSchema);
// "info" shows every collected ID with its key: the evidence a violation report cites.
await logToStderr("info");
const log = new LineLog(config.logPath);
const closing = new AbortController();
// Started like a worker: a connect or open that times out on a loaded machine (3 s; seed 2 of the
// second mixed runs, load 32) or meets a store fault is tried again, not the harness's failure.
await using opened = await startWhenReachable(() => openBackend(config.store, config.node));
await using alloc = await startWhenReachable(() =>
  Allocator.open(opened.backend, {
    min: config.range.min,
    max: config.range.max,
    leaseTtlMs: config.timings.leaseTtlMs,
    syncIntervalMs: config.timings.syncIntervalMs,
    // Passes every 500 ms–1 s, faster than the workers' leases, with a grace of the lease TTL (the
    // workers' too) unless the run sets one (the mixed Kubernetes run: Cilium's heartbeat timeout):
    // a revoked holder has had its lease deadline to fence itself before its ID can go to another
    // key. On every store: Kubernetes' own default (Cilium's 30 min heartbeat timeout) would keep
    // all a run makes. `NEMESIS_GC_GRACE_MS` overrides it (0: the old default of explicit `runGc`
    // calls, to see what the grace prevents).
    gcGraceMs: Deno.env.get("NEMESIS_GC_GRACE_MS") === undefined
      ? config.gcGraceMs ?? config.timings.leaseTtlMs
      : Number(Deno.env.get("NEMESIS_GC_GRACE_MS")),
  })
);

const loop = (async () => {
  const who = { node: config.node, inc: config.node };
  while (!closing.signal.aborted) {
    const start = Date.now();
    try {
      const signal = AbortSignal.any([
        closing.signal,
        AbortSignal.timeout(config.timings.callTimeoutMs),
      ]);
      const stats = await alloc.runGc({ signal });
      log.write({
        t: "gc",
        ...who,
        start,
        end: Date.now(),
        deleted: [...stats.deletedIds],
        marked: stats.marked,
        alive: stats.alive,
      });
    } catch (err) {
      if (closing.signal.aborted) break;
      log.write({ t: "gc", ...who, start, end: Date.now(), error: String(err).slice(0, 500) });
    }
    await sleep(config.timings.gcIntervalMs, closing.signal).catch(() => {});
  }
})();
console.log("ready");

for await (const command of stdinLines()) {
  if (command === "stop") break;
}
closing.abort();
await loop;
log.close();
console.log("stopped");
