/**
 * A node in its own process: opens the store from a JSON spec, allocates the given keys (all at
 * once), prints `{"ready":true}` … then one JSON line `{key: id}` and, unless told to hold, exits.
 *
 * deno run -A tests/_support/child_allocate.ts '<spec json>' <node> <max> <keyCount> <leaseTtlMs> [hold]
 */
import process from "node:process";
import { Allocator } from "../../mod.ts";
import { openBackendFromSpec } from "./open_backend.ts";
import type { StoreSpec } from "../../src/testing/fixture.ts";

const [specJson, node, max, count, leaseTtlMs, mode] = process.argv.slice(2);
const spec = JSON.parse(specJson) as StoreSpec;
await using opened = await openBackendFromSpec(spec, node, { fast: true });
await using alloc = await Allocator.open(opened.backend, {
  max: Number(max),
  leaseTtlMs: Number(leaseTtlMs),
  backoff: { initialMs: 5, maxMs: 200, factor: 2 },
  maxAttempts: 64,
});
const keys = Array.from(
  { length: Number(count) },
  (_, i) => `key${String(i + 1).padStart(4, "0")}`,
);
const results = await Promise.all(keys.map((k) => alloc.allocate(k)));
const ids: Record<string, number> = {};
keys.forEach((k, i) => (ids[k] = results[i].id));
console.log(JSON.stringify(ids));
if (mode === "hold") {
  // Stay alive (renewing the lease) until killed.
  await new Promise(() => {});
}
