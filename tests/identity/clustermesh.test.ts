/**
 * Two clusters on separate stores, each merging the other's identities (clustermesh), on every
 * backend. Remote identities are validated: a misconfigured remote cannot inject identities
 * outside its range or with another cluster's name.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../src/allocator/allocator.ts";
import { InvalidOptionsError } from "../../src/errors.ts";
import {
  allocationRange,
  IdentityAllocator,
  Label,
  Labels,
  labelsCodec,
} from "../../src/identity/mod.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";
import { testEachBackend } from "../_support/factories.ts";
import { Owner } from "./_owner.ts";

const inCluster = (name: string, ...labels: string[]) =>
  Labels.parse([...labels, `k8s:io.cilium.k8s.policy.cluster=${name}`]);

/** Writes `labels` with an ID from `min` straight into a store, as a misconfigured agent would. */
async function plant(fx: StoreFixture, node: string, min: number, labels: Labels): Promise<number> {
  const backend = await fx.backend(node, { fast: true });
  await using raw = await Allocator.open(backend, { min, max: min + 1000, codec: labelsCodec });
  return (await raw.allocate(labels)).id;
}

testEachBackend("two clusters on separate stores see each other's identities", async (f) => {
  await using store1 = await f.create();
  await using store2 = await f.create();
  await using c1 = await IdentityAllocator.open(await store1.backend("c1-node", { fast: true }), {
    clusterId: 1,
    clusterName: "cluster-1",
  });
  await using c2 = await IdentityAllocator.open(await store2.backend("c2-node", { fast: true }), {
    clusterId: 2,
    clusterName: "cluster-2",
  });
  const web1 = inCluster("cluster-1", "k8s:app=web");
  const web2 = inCluster("cluster-2", "k8s:app=web");
  const a1 = (await c1.allocate(web1)).identity;
  const a2 = (await c2.allocate(web2)).identity;
  assert.ok(a1.id >= 65536 && a1.id < 131072);
  assert.ok(a2.id >= 131072 && a2.id < 196608);

  // Misconfigured writers on cluster 2's store: an ID in cluster 1's range, and an in-range ID
  // whose labels claim cluster 1. Neither may show up in cluster 1's view of cluster 2.
  const outOfRange = await plant(
    store2,
    "rogue-1",
    allocationRange(1).min + 5000,
    inCluster("cluster-2", "k8s:app=rogue"),
  );
  const wrongName = await plant(
    store2,
    "rogue-2",
    allocationRange(2).min + 5000,
    inCluster("cluster-1", "k8s:app=spoof"),
  );

  await using owner1 = new Owner(c1);
  await using owner2 = new Owner(c2);
  const stop = new AbortController();
  await c1.watchRemote("cluster-2", await store2.backend("c1-mesh", { fast: true }), {
    clusterId: 2,
    signal: stop.signal,
  });
  await c2.watchRemote("cluster-1", await store1.backend("c2-mesh", { fast: true }), {
    clusterId: 1,
  });

  // Each sees the other's identity: lookups right after the initial sync, and the change stream.
  assert.equal(c1.lookup(web2)?.id, a2.id);
  assert.ok(c1.lookupById(a2.id)?.labels.equals(web2));
  assert.equal(c2.lookup(web1)?.id, a1.id);
  assert.ok(c2.lookupById(a1.id)?.labels.equals(web1));
  await owner1.has(a2.id, web2);
  await owner2.has(a1.id, web1);
  assert.deepEqual(c1.remotes(), [{ name: "cluster-2", clusterId: 2, identities: 1 }]);

  // The rejected ones are nowhere.
  for (const id of [outOfRange, wrongName]) {
    assert.equal(c1.lookupById(id), undefined);
    assert.ok(!owner1.cache.has(id));
    assert.ok(![...c1.entries()].some((i) => i.id === id));
  }

  // Live: a new identity in cluster 2 reaches cluster 1; a rogue one written before it does not.
  const rogueLive = await plant(
    store2,
    "rogue-3",
    allocationRange(3).min,
    inCluster("cluster-2", "k8s:app=late-rogue"),
  );
  const db2 = inCluster("cluster-2", "k8s:app=db");
  const b2 = (await c2.allocate(db2)).identity;
  await owner1.has(b2.id, db2);
  assert.equal(c1.lookup(db2)?.id, b2.id);
  assert.ok(!owner1.cache.has(rogueLive));
  assert.equal(c1.lookupById(rogueLive), undefined);

  // Remote identities never enter the local store or its GC.
  assert.ok(!(await store1.masters()).has(a2.id));

  // Cluster 2 goes away (signal): its identities are withdrawn from cluster 1.
  stop.abort();
  await owner1.lacks(a2.id);
  await owner1.lacks(b2.id);
  assert.equal(c1.lookup(web2), undefined);
  assert.equal(c1.lookupById(b2.id), undefined);
  assert.deepEqual(c1.remotes(), []);
  assert.ok(owner1.cache.has(a1.id), "own identities stay");

  // removeRemote withdraws too.
  assert.equal(await c2.removeRemote("cluster-1"), true);
  await owner2.lacks(a1.id);
  assert.equal(c2.lookup(web1), undefined);
  assert.equal(await c2.removeRemote("cluster-1"), false);
});

testEachBackend(
  "re-watching a remote replaces it; an abort before sync leaves nothing",
  async (f) => {
    await using store1 = await f.create();
    await using store2 = await f.create();
    await using c1 = await IdentityAllocator.open(await store1.backend("n1", { fast: true }), {
      clusterId: 1,
      clusterName: "cluster-1",
    });
    await using c2 = await IdentityAllocator.open(await store2.backend("n2", { fast: true }), {
      clusterId: 2,
      clusterName: "cluster-2",
    });
    const x = (await c2.allocate(inCluster("cluster-2", "k8s:app=x"))).identity;
    await using owner = new Owner(c1);

    await c1.watchRemote("cluster-2", await store2.backend("m1", { fast: true }), { clusterId: 2 });
    await owner.has(x.id, x.labels);

    // Replacing the remote with the same name keeps identities both versions have.
    await c1.watchRemote("cluster-2", await store2.backend("m2", { fast: true }), { clusterId: 2 });
    assert.equal(c1.lookupById(x.id)?.id, x.id);
    assert.equal(c1.remotes().length, 1);

    // An already-aborted watch rejects and leaves the registered remote alone.
    const aborted = AbortSignal.abort(new DOMException("gone", "AbortError"));
    await assert.rejects(
      c1.watchRemote("cluster-2", await store2.backend("m3", { fast: true }), {
        clusterId: 2,
        signal: aborted,
      }),
      (err: unknown) => err instanceof DOMException && err.name === "AbortError",
    );
    assert.equal(c1.lookupById(x.id)?.id, x.id);
    assert.ok(owner.cache.has(x.id));

    // Misconfigurations are refused up front.
    const b = await store2.backend("m4", { fast: true });
    await assert.rejects(c1.watchRemote("cluster-3", b, { clusterId: 1 }), InvalidOptionsError);
    await assert.rejects(c1.watchRemote("cluster-1", b, { clusterId: 3 }), InvalidOptionsError);
    await assert.rejects(c1.watchRemote("other", b, { clusterId: 2 }), InvalidOptionsError);
    await assert.rejects(c1.watchRemote("c;x", b, { clusterId: 4 }), InvalidOptionsError);
    await assert.rejects(c1.watchRemote("big", b, { clusterId: 256 }), InvalidOptionsError);
    assert.ok(new Label("k8s", "io.cilium.k8s.policy.cluster", "cluster-2"));
  },
);
