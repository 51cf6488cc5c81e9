/**
 * `deno task etcd`: the cluster scenario (four node processes agree on IDs, one is killed, GC
 * reclaims) on etcd, in Cilium's key layout. Uses `ETCD_ENDPOINTS` (comma-separated client URLs)
 * if set, else starts a private etcd on loopback when an `etcd` binary is installed, else explains
 * and exits 0.
 *
 * @module
 */
import { EtcdBackend } from "@idalloc/idalloc/etcd";
import { type EtcdCluster, findEtcd, startEtcd } from "../../tests/_support/etcd.ts";
import { type ClusterStore, runCluster } from "../cluster/scenario.ts";

let etcd: EtcdCluster | undefined;
let endpoints = Deno.env.get("ETCD_ENDPOINTS")?.split(",").map((e) => e.trim()).filter(Boolean);
if (endpoints === undefined || endpoints.length === 0) {
  if (findEtcd() === undefined) {
    console.log(
      "skipped: no etcd. Set ETCD_ENDPOINTS=http://127.0.0.1:2379 or install one " +
        "(Debian/Ubuntu: apt-get install etcd-server) and run `deno task etcd` again.",
    );
    Deno.exit(0);
  }
  etcd = await startEtcd();
  endpoints = [...etcd.endpoints];
  console.log(`started a private etcd at ${endpoints.join(", ")}`);
} else {
  console.log(`using etcd at ${endpoints.join(", ")} (ETCD_ENDPOINTS)`);
}

// A fresh prefix per run, so that a shared etcd keeps runs apart.
const prefix = `idalloc-example/${crypto.randomUUID().slice(0, 8)}`;
console.log(`Cilium's layout under ${prefix}: id/<ID> → key, value/<key>/<node> → ID (leased)\n`);
const store: ClusterStore = { kind: "etcd", endpoints, prefix };
let ok = false;
try {
  await using operator = await EtcdBackend.connect({ endpoints, prefix, node: "operator" });
  ok = await runCluster(store, operator);
} finally {
  await etcd?.close();
}
if (!ok) Deno.exit(1);
