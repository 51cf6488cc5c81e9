// The identity layer's `watchRemote` (clustermesh) on this backend, with two API servers: cluster
// 1 on the test process's shared kube-apiserver, cluster 2 on a second one started here (its own
// etcd), so the remote is another API server, not another CRD group of the same one. Cluster 1
// reads cluster 2 through a read-only session: its identities join cluster 1's lookups and change
// stream at once and live, a collected one leaves again, and cluster 1's node writes nothing there.
import assert from "node:assert/strict";
import { IdentityAllocator, Labels } from "../../../src/identity/mod.ts";
import { NODE_SELECTOR } from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import { startKubeApiServer } from "../../../src/backends/k8s/testing/cluster.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

const inCluster = (name: string, app: string) =>
  Labels.parse([`k8s:app=${app}`, `k8s:io.cilium.k8s.policy.cluster=${name}`]);

k8sTest(
  "watchRemote: a cluster reads another API server's identities, at once and live",
  async () => {
    await using fx1 = await fixture();
    await using server2 = await startKubeApiServer({ ciliumCrds: false });
    await using fx2 = await fixture(server2);
    assert.notEqual(fx1.cluster.server, fx2.cluster.server, "two API servers");
    const open = async (fx: typeof fx1, node: string, clusterId: number) =>
      await IdentityAllocator.open(await fx.backend(node), {
        clusterId,
        clusterName: `cluster-${clusterId}`,
        leaseTtlMs: 3_000,
      });
    await using c1 = await open(fx1, "c1-node", 1);
    await using c2 = await open(fx2, "c2-node", 2);
    const web2 = inCluster("cluster-2", "web");
    const a2 = (await c2.allocate(web2)).identity;

    const stop = new AbortController();
    await c1.watchRemote("cluster-2", await fx2.backend("c1-mesh"), {
      clusterId: 2,
      signal: stop.signal,
    });
    assert.equal(c1.lookup(web2)?.id, a2.id, "in lookups once the remote is synced");
    assert.deepEqual(c1.remotes(), [{ name: "cluster-2", clusterId: 2, identities: 1 }]);

    const db2 = inCluster("cluster-2", "db");
    const b2 = (await c2.allocate(db2)).identity;
    await eventually(() => c1.lookup(db2)?.id === b2.id, "a new remote identity arrives live");

    await c2.release(b2);
    // A lease TTL of grace (this store's own default is Cilium's 30 min).
    const gc = await fx2.allocator("gc2", { min: 131072, max: 196607, gcGraceMs: 3_000 });
    await eventually(async () => (await gc.runGc()).deletedIds.includes(b2.id), "collected there");
    await eventually(() => c1.lookupById(b2.id) === undefined, "and gone here");

    // The remote side is read-only: no Lease of cluster 1's node on cluster 2's API server.
    const leases = await fx2.client.list(LEASES, {
      namespace: fx2.namespace,
      labelSelector: NODE_SELECTOR,
      signal: deadline(),
    });
    assert.deepEqual(
      leases.items.map((l) => (l.spec as { holderIdentity?: string }).holderIdentity).sort(),
      ["c2-node", "gc2"],
    );
    stop.abort();
    await eventually(() => c1.lookup(web2) === undefined, "withdrawn when the watch stops");
  },
);
