/**
 * A node in its own process for the stall tests: it holds one key and, every 10 ms, asks for it
 * through `get`, `cachedId` and `allocate`/`release` of the held key, printing one JSON line per
 * sample with the time it started (`t0`) and ended (`t1`). It also prints every `watch()` event.
 * The test stops it with SIGSTOP and resumes it with SIGCONT; it exits when stdin closes.
 *
 * deno run -A tests/_support/child_stall.ts '<spec json>' <node> <key> <max> <leaseTtlMs>
 */
import process from "node:process";
import { Allocator } from "../../mod.ts";
import { openBackendFromSpec } from "./open_backend.ts";
import type { StoreSpec } from "../../src/testing/fixture.ts";

const [specJson, node, key, max, leaseTtlMs] = process.argv.slice(2);
const spec = JSON.parse(specJson) as StoreSpec;
const out = (line: Record<string, unknown>) => console.log(JSON.stringify(line));

await using opened = await openBackendFromSpec(spec, node, { fast: true });
await using alloc = await Allocator.open(opened.backend, {
  max: Number(max),
  leaseTtlMs: Number(leaseTtlMs),
  syncIntervalMs: 600_000,
  backoff: { initialMs: 5, maxMs: 100, factor: 2 },
});
const { id } = await alloc.allocate(key);
out({ event: "held", id });

const stop = new AbortController();
const watching = (async () => {
  for await (const event of alloc.watch({ signal: stop.signal })) {
    out({ event: "watch", t: Date.now(), ...event });
  }
})().catch(() => {});

const sampling = (async () => {
  while (!stop.signal.aborted) {
    const t0 = Date.now();
    const cached = alloc.cachedId(key);
    let got: number | string | undefined;
    let allocated: number | string;
    try {
      got = await alloc.get(key, { signal: AbortSignal.timeout(5_000) });
      allocated = (await alloc.allocate(key, { signal: AbortSignal.timeout(5_000) })).id;
      await alloc.release(key);
    } catch (err) {
      got ??= (err as Error).name;
      allocated = (err as Error).name;
    }
    const status = alloc.status();
    out({
      event: "sample",
      t0,
      t1: Date.now(),
      cached: cached ?? null,
      get: got ?? null,
      allocate: allocated,
      fenced: status.fence.active,
      healthy: status.healthy,
    });
    await new Promise((r) => setTimeout(r, 10));
  }
})();

// Runs until the test closes stdin.
for await (const _ of process.stdin) { /* discard */ }
const status = alloc.status();
out({ event: "status", fence: status.fence, healthy: status.healthy });
stop.abort();
await Promise.all([watching, sampling]);
