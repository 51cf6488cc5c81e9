/**
 * One idalloc node in its own process, for the race test: connects through a kubeconfig, prints
 * `{"ready":true}` once its cache is synced, waits for stdin to close (the start signal), then
 * allocates the race's keys 16 at a time and prints one JSON line `{ids, created}`.
 *
 * deno run -A tests/backends/k8s/_race_child.ts <kubeconfig> <node> <group> <namespace> <count>
 */
import process from "node:process";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import { allocateAll, raceKeys } from "./_race.ts";

const [kubeconfig, node, group, namespace, count] = process.argv.slice(2);
await using backend = await K8sBackend.connect({
  node,
  kubeconfig,
  namespace,
  resource: { group },
  maxClockSkewMs: 500,
  // The race is about allocation, not connecting: three processes starting at once on a loaded
  // machine waited on the API server's first answer for longer than the default 5 s.
  connectTimeoutMs: 30_000,
});
await using alloc = await Allocator.open(backend, {
  min: 256,
  max: 65535,
  leaseTtlMs: 3_000,
  maxAttempts: 64,
  backoff: { initialMs: 5, maxMs: 200, factor: 2 },
});
await alloc.waitForInitialSync();
console.log(JSON.stringify({ ready: true }));
for await (const _ of process.stdin) { /* the start signal is stdin's end */ }
console.log(JSON.stringify(await allocateAll(alloc, raceKeys(Number(count)))));
