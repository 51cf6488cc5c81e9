// The per-side counts as metrics, named after Cilium operator's counters: a writable double-write
// session reports `idalloc.identity.{kvstore,crd}.{total,only}_count` and
// `idalloc.identity.differing_count` from its watches of both sides, on a real etcd and API server.
import assert from "node:assert/strict";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { installSdk } from "../../_support/telemetry.ts";
import { startStores } from "./_world.ts";

const ignore = kubeApiserverUnavailable() !== undefined || etcdUnavailable() !== undefined;

Deno.test({
  name: "telemetry: a double-write node reports identities per side and on one side only",
  ignore,
  async fn() {
    await using sdk = installSdk();
    await using stores = await startStores();
    // One identity on the kvstore only (written there directly), then two on both sides.
    {
      await using kv = await stores.node("kvstore", "e1");
      await kv.alloc.allocate("k8s:app=kvstore-only;");
    }
    await using node = await stores.node("doublewrite-readcrd", "d1");
    {
      await node.alloc.allocate("k8s:app=a;");
      await node.alloc.allocate("k8s:app=b;");
      const want = {
        "idalloc.identity.kvstore.total_count": 3,
        "idalloc.identity.kvstore.only_count": 1,
        "idalloc.identity.crd.total_count": 2,
        "idalloc.identity.crd.only_count": 0,
        "idalloc.identity.differing_count": 0,
      };
      // The other side's watch reports the allocations when their events arrive: ask until then
      // (no time is asserted; the test's own timeout bounds a hang).
      let got: Record<string, number> = {};
      for (let i = 0; i < 400; i++) {
        const points = (await sdk.collect()).filter((p) => p.name.startsWith("idalloc.identity."));
        got = Object.fromEntries(points.map((p) => [p.name, p.value]));
        const same = Object.entries(want).every(([name, value]) => got[name] === value);
        if (same && Object.keys(got).length === Object.keys(want).length) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      assert.deepEqual(got, want);
      const point = (await sdk.collect()).find((p) =>
        p.name === "idalloc.identity.crd.total_count"
      );
      assert.equal(point?.attributes["idalloc.backend"], "doublewrite-readcrd");
      assert.equal(point?.attributes["idalloc.node"], "d1");
    }
  },
});
