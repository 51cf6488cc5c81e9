/**
 * `deno task identity`: Cilium-style security identities on an embedded Deno KV store.
 *
 * 1. Label sets become global identities in this cluster's range (the same on every node).
 * 2. Reserved label sets (`reserved:host`, …) map to fixed IDs and never touch the store.
 * 3. CIDR label sets get node-local identities (`0x01000000 | n`), also never stored.
 * 4. A remote cluster's identities join lookups and the change stream (clustermesh).
 *
 * Exits 1 if a check fails.
 *
 * @module
 */
import { DenoKvBackend } from "@idalloc/idalloc";
import {
  allocationRange,
  hasLocalScope,
  IdentityAllocator,
  type IdentityChange,
  Labels,
} from "@idalloc/idalloc/identity";

let ok = true;
function check(condition: boolean, what: string): void {
  console.log(`  ${condition ? "✔" : "✘"} ${what}`);
  ok &&= condition;
}

// Two clusters, each with its own namespace in one KV store (in production: separate stores).
using kv = await Deno.openKv(":memory:");
const fast = { pollIntervalMs: 50, maxClockSkewMs: 200 };
const homeStore = new DenoKvBackend(kv, { prefix: ["cluster-1"], node: "10.0.1.1", ...fast });
const remoteStore = new DenoKvBackend(kv, { prefix: ["cluster-2"], node: "10.0.2.1", ...fast });
await using home = await IdentityAllocator.open(homeStore, {
  clusterId: 1,
  clusterName: "cluster-1",
});
await using remote = await IdentityAllocator.open(remoteStore, {
  clusterId: 2,
  clusterName: "cluster-2",
});

console.log("1. label sets → global identities in cluster 1's range", allocationRange(1));
const web = Labels.parse([
  "k8s:app=web",
  "k8s:io.kubernetes.pod.namespace=prod",
  "k8s:io.cilium.k8s.policy.cluster=cluster-1",
]);
const first = await home.allocate(web);
const again = await home.allocate(web);
console.log(`  ${web} → ${first.identity.id} (isNew: ${first.isNew})`);
check(again.identity.id === first.identity.id && !again.isNew, "the same labels, the same ID");
const range = allocationRange(1);
check(
  first.identity.id >= range.min && first.identity.id <= range.max,
  "the ID carries cluster 1 in bits 16–23",
);

console.log("\n2. reserved identities: fixed IDs, never stored");
for (const text of ["reserved:host", "reserved:world", "reserved:health"]) {
  const { identity } = await home.allocate(Labels.parse([text]));
  console.log(`  ${text} → ${identity.id}`);
}
check(home.lookupById(1)?.labels.toString() === "reserved:host", "ID 1 is reserved:host");

console.log("\n3. CIDR identities: node-local, in the local scope");
const cidr = await home.allocate(Labels.parse(["cidr:10.0.0.0/8", "reserved:world"]));
console.log(
  `  ${cidr.identity.labels} → ${cidr.identity.id} (0x${cidr.identity.id.toString(16)})`,
);
check(hasLocalScope(cidr.identity.id), "the ID has the local scope bit (1 << 24)");

console.log("\n4. a remote cluster: cluster-2's identities, merged into cluster-1's view");
const api = Labels.parse(["k8s:app=api", "k8s:io.cilium.k8s.policy.cluster=cluster-2"]);
const remoteApi = (await remote.allocate(api)).identity;
console.log(`  cluster-2 allocated ${api} → ${remoteApi.id}`);
const stop = new AbortController();
const changes = home.changes({ signal: stop.signal, replay: false })[Symbol.asyncIterator]();
await home.watchRemote("cluster-2", remoteStore, { clusterId: 2, signal: stop.signal });
console.log(`  cluster-1 sees remotes: ${JSON.stringify(home.remotes())}`);
check(home.lookupById(remoteApi.id)?.labels.equals(api) ?? false, "lookup by the remote ID");
check(home.lookup(api)?.id === remoteApi.id, "lookup by the remote labels");
/** Reads change batches until one adds `id` (earlier batches may carry this cluster's echoes). */
async function addedLater(id: number): Promise<boolean> {
  for (;;) {
    const { value, done } = await changes.next();
    if (done) return false;
    if ((value as IdentityChange).added.has(id)) return true;
  }
}
check(await addedLater(remoteApi.id), "the change stream reported the remote identity");

// A new remote identity shows up live.
const cache = Labels.parse(["k8s:app=cache", "k8s:io.cilium.k8s.policy.cluster=cluster-2"]);
const remoteCache = (await remote.allocate(cache)).identity;
check(await addedLater(remoteCache.id), `live: ${cache} → ${remoteCache.id}`);
check(home.lookupById(remoteCache.id) !== undefined, "and it is in cluster-1's lookups");
stop.abort();
await changes.return?.();

console.log(
  `\n5. release: ${await home.release(first.identity)} (not the last use), ` +
    `${await home.release(again.identity)} (the last: the identity stays until GC)`,
);
console.log(ok ? "\nall checks passed" : "\nSOME CHECKS FAILED");
if (!ok) Deno.exit(1);
