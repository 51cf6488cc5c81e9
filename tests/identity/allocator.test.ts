/**
 * Cilium's identity-cache tests (`pkg/identity/cache`) on every backend, through the conformance
 * factories: real Deno KV files and a real etcd.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../src/allocator/allocator.ts";
import { InvalidOptionsError, KeyNotHeldError } from "../../src/errors.ts";
import {
  hasLocalScope,
  IdentityAllocator,
  type IdentityAllocatorOptions,
  LabelError,
  Labels,
  labelsCodec,
  WellKnownIdentity,
} from "../../src/identity/mod.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";
import { testEachBackend } from "../_support/factories.ts";
import { Owner } from "./_owner.ts";
import { eventually } from "../_support/eventually.ts";

const lbls1 = Labels.parse(["blah=%%//!!", "id=foo", "user=anna"]);
const lbls2 = Labels.parse(["id=bar", "user=anna"]);
const lbls3 = Labels.parse(["id=bar", "user=susan"]);

async function open(
  fx: StoreFixture,
  node: string,
  options: IdentityAllocatorOptions = {},
): Promise<IdentityAllocator> {
  return await IdentityAllocator.open(await fx.backend(node, { fast: true }), options);
}

testEachBackend("TestAllocator: sequence, reuse, release, store delete", async (factory) => {
  await using fx = await factory.create();
  await using identities = await open(fx, "10.0.0.1");
  await using owner = new Owner(identities);

  // 1. New identity; the owner sees it.
  const a = await identities.allocate(lbls1);
  assert.equal(a.isNew, true);
  assert.ok(a.identity.id >= 256 && a.identity.id <= 65535);
  await owner.has(a.identity.id, lbls1);
  // The store holds Cilium's key, byte for byte.
  assert.equal(
    (await fx.masters()).get(a.identity.id),
    "unspec:blah=%%//!!;unspec:id=foo;unspec:user=anna;",
  );

  // 2. Same labels: same ID, not new.
  const b = await identities.allocate(lbls1);
  assert.equal(b.isNew, false);
  assert.equal(b.identity.id, a.identity.id);

  // 3. Releases: the second is the last use; the identity stays (its master remains until GC).
  assert.equal(await identities.release(a.identity), false);
  assert.equal(await identities.release(b.identity), true);
  assert.ok(owner.cache.has(a.identity.id));
  assert.ok((await fx.masters()).has(a.identity.id));

  // 4. Re-allocate: the existing master is reused (not new, same ID).
  const c = await identities.allocate(lbls1);
  assert.equal(c.isNew, false);
  assert.equal(c.identity.id, a.identity.id);
  assert.ok(identities.lookupById(c.identity.id)?.labels.equals(lbls1));
  assert.ok((await identities.resolveById(c.identity.id))?.labels.equals(lbls1));

  // 5. Two more label sets: new, distinct IDs; the owner sees both.
  const d = await identities.allocate(lbls2);
  const e = await identities.allocate(lbls3);
  assert.equal(d.isNew, true);
  assert.equal(e.isNew, true);
  assert.equal(new Set([a.identity.id, d.identity.id, e.identity.id]).size, 3);
  await owner.has(d.identity.id, lbls2);
  await owner.has(e.identity.id, lbls3);

  // 6. Each release is the last use.
  assert.equal(await identities.release(c.identity), true);
  assert.equal(await identities.release(d.identity), true);
  assert.equal(await identities.release(e.identity), true);
  await assert.rejects(identities.release(e.identity), KeyNotHeldError);

  // 7. Deleting every key in the store reaches the owner as deletes.
  for (const id of (await fx.masters()).keys()) await fx.deleteMaster(id);
  await owner.lacks(e.identity.id);
  await owner.lacks(a.identity.id);
  assert.equal(identities.lookup(lbls3), undefined);
});

testEachBackend("every node gets the same global identity", async (factory) => {
  await using fx = await factory.create();
  await using nodeA = await open(fx, "10.0.0.1");
  await using nodeB = await open(fx, "10.0.0.2");
  const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
  const [ra, rb] = await Promise.all([nodeA.allocate(labels), nodeB.allocate(labels)]);
  assert.equal(ra.identity.id, rb.identity.id);
  assert.equal([ra.isNew, rb.isNew].filter(Boolean).length, 1);
  await using ownerB = new Owner(nodeB);
  await ownerB.has(ra.identity.id, labels);
  assert.equal(nodeB.lookup(labels)?.id, ra.identity.id);
  assert.ok((await nodeB.resolveById(ra.identity.id))?.labels.equals(labels));
  assert.equal((await nodeA.resolve(labels))?.id, ra.identity.id);
});

testEachBackend("TestLocalAllocation: node-local identities never touch the store", async (f) => {
  await using fx = await f.create();
  await using identities = await open(fx, "10.0.0.1");
  await using owner = new Owner(identities);
  const labels = Labels.parse(["cidr:192.0.2.3/32"]);

  // 1. New and local; the owner has it.
  const first = await identities.allocate(labels);
  assert.equal(first.isNew, true);
  assert.ok(hasLocalScope(first.identity.id));
  await owner.has(first.identity.id, labels);
  // 2. Again: not new; it is in the identity cache.
  const second = await identities.allocate(labels);
  assert.equal(second.isNew, false);
  assert.equal(second.identity.id, first.identity.id);
  assert.ok([...identities.entries()].some((i) => i.id === first.identity.id));
  // 3. First release keeps it; the second removes it everywhere.
  assert.equal(await identities.release(first.identity), false);
  assert.ok(owner.cache.has(first.identity.id));
  assert.equal(await identities.release(second.identity), true);
  await owner.lacks(first.identity.id);
  assert.ok(![...identities.entries()].some((i) => i.id === first.identity.id));
  // 4. Re-allocate: new and local again; release: true.
  const again = await identities.allocate(labels);
  assert.equal(again.isNew, true);
  assert.ok(hasLocalScope(again.identity.id));
  assert.equal(await identities.release(again.identity), true);
  // Nothing of it reached the store.
  assert.equal((await fx.masters()).size, 0);
  assert.equal((await fx.references()).length, 0);
});

testEachBackend("reserved identities resolve without the store", async (factory) => {
  await using fx = await factory.create();
  await using identities = await open(fx, "foo", { fixedIdentities: { 129: "kvstore" } });
  const cases: Array<[string[], number]> = [
    [["reserved:host"], 1],
    [["reserved:world"], 2],
    [["reserved:health"], 4],
    [["reserved:init"], 5],
    [["reserved:unmanaged"], 3],
    [["io.cilium.fixed-identity=kvstore"], 129],
  ];
  for (const [labels, id] of cases) {
    const { identity, isNew } = await identities.allocate(Labels.parse(labels));
    assert.equal(identity.id, id);
    assert.equal(isNew, false);
    assert.equal(await identities.release(identity), false);
    assert.equal(identities.lookup(Labels.parse(labels))?.id, id);
  }
  assert.equal(identities.lookupById(1)?.labels.toString(), "reserved:host");
  assert.equal(identities.lookupById(0)?.labels.toString(), "reserved:unknown");
  assert.equal(identities.lookupById(2)?.id, 2);
  assert.equal((await fx.masters()).size, 0);
  // TestAllocateLocally: local allocation with an old ID, and the global refusal.
  const cidr = identities.allocateLocal(Labels.parse(["cidr:1.2.3.4/32"]), {
    oldId: 0x01000000 + 50,
  });
  assert.equal(cidr.isNew, true);
  assert.equal(cidr.identity.id, 0x01000032);
  assert.throws(
    () => identities.allocateLocal(Labels.parse(["k8s:foo=bar"])),
    (err: unknown) =>
      err instanceof LabelError && err.message === "labels would result in global identity",
  );
  await assert.rejects(identities.allocate(Labels.empty), LabelError);
});

testEachBackend("TestGetIdentityCache: reserved, well-known, local and global", async (f) => {
  await using fx = await f.create();
  await using identities = await open(fx, "10.0.0.1", { clusterId: 5 });
  const global = await identities.allocate(Labels.parse(["k8s:app=db"]));
  const local = await identities.allocate(Labels.parse(["fqdn:example.com"]));
  // No waiting for the store's watch echo: identities this node holds are known at once.
  const ids = new Set([...identities.entries()].map((i) => i.id));
  for (const id of [1, 2, WellKnownIdentity.CiliumKVStore, global.identity.id, local.identity.id]) {
    assert.ok(ids.has(id), `${id}`);
  }
  // Cluster 5 allocates from its own range.
  assert.ok(global.identity.id >= 327680 && global.identity.id <= 393215, `${global.identity.id}`);
  assert.deepEqual(identities.range, { min: 327680, max: 393215 });
});

testEachBackend("TestAllocatorReset: close and open again", async (factory) => {
  await using fx = await factory.create();
  const labels = Labels.parse(["id=bar", "user=anna"]);
  let id = 0;
  for (let round = 0; round < 2; round++) {
    await using identities = await open(fx, "10.0.0.1");
    await using owner = new Owner(identities, false);
    const { identity } = await identities.allocate(labels);
    id ||= identity.id;
    assert.equal(identity.id, id);
    // The first update the owner gets carries the ID.
    await owner.until(() => owner.batches.length > 0);
    assert.ok(owner.batches[0].added.has(id));
    await identities.release(identity);
  }
});

testEachBackend("GC runs only within the own cluster's range", async (factory) => {
  await using fx = await factory.create();
  // Two clusters sharing one store namespace (misconfigured on purpose): GC of cluster 1 must
  // never collect cluster 2's unused identities.
  // No grace: the two passes below are back to back.
  await using c1 = await open(fx, "n1", { clusterId: 1, clusterName: "c1", gcGraceMs: 0 });
  await using c2 = await open(fx, "n2", { clusterId: 2, clusterName: "c2" });
  const one = await c1.allocate(Labels.parse(["k8s:app=one"]));
  const two = await c2.allocate(Labels.parse(["k8s:app=two"]));
  assert.ok(one.identity.id >= 65536 && one.identity.id < 131072);
  assert.ok(two.identity.id >= 131072 && two.identity.id < 196608);
  await c1.release(one.identity);
  await c2.release(two.identity);
  await c1.runGc(); // marks
  const stats = await c1.runGc(); // collects
  assert.deepEqual(stats.deletedIds, [one.identity.id]);
  const masters = await fx.masters();
  assert.ok(!masters.has(one.identity.id));
  assert.ok(masters.has(two.identity.id));
});

testEachBackend("corrupt or non-canonical keys in range are skipped", async (factory) => {
  await using fx = await factory.create();
  // A raw allocator writes a key that is not a canonical label set (unsorted).
  const raw = await Allocator.open(await fx.backend("raw", { fast: true }), {
    min: 256,
    max: 65535,
  });
  const bad = await raw.allocate("k8s:b=2;k8s:a=1;");
  const good = await raw.allocate(labelsCodec.encode(Labels.parse(["k8s:a=1", "k8s:b=2"])));
  await raw.close();
  await using identities = await open(fx, "10.0.0.1");
  await identities.waitForInitialSync();
  assert.ok(identities.lookupById(good.id)?.labels.equals(Labels.parse(["k8s:a=1", "k8s:b=2"])));
  assert.equal(identities.lookupById(bad.id), undefined);
});

testEachBackend("bad options are InvalidOptionsError", async (factory) => {
  await using fx = await factory.create();
  const backend = await fx.backend("n", { fast: true });
  const bad: unknown[] = [
    { clusterId: 256 },
    { clusterId: 512, maxConnectedClusters: 511 },
    { clusterId: -1 },
    { maxConnectedClusters: 1023 },
    { clusterName: "a;b" },
    { fixedIdentities: { 12: "x" } },
    { node: "10.0.0.1" },
  ];
  for (const options of bad) {
    await assert.rejects(
      IdentityAllocator.open(backend, options as IdentityAllocatorOptions),
      InvalidOptionsError,
      JSON.stringify(options),
    );
  }
  await using ok = await IdentityAllocator.open(backend, {
    clusterId: 511,
    maxConnectedClusters: 511,
  });
  assert.deepEqual(ok.range, { min: 511 << 15, max: (512 << 15) - 1 });
});

testEachBackend("remote-node scope and withheld local IDs, as Cilium", async (factory) => {
  await using fx = await factory.create();
  const node = Labels.parse(["reserved:remote-node", "node:name=worker-1"]);
  {
    // Default: remote nodes share the reserved remote-node identity, with their own labels.
    await using identities = await open(fx, "a");
    const { identity } = await identities.allocate(node);
    assert.equal(identity.id, 6);
    assert.ok(identity.labels.equals(node));
  }
  await using identities = await open(fx, "b", { remoteNodeScope: true });
  const first = await identities.allocate(node);
  assert.equal(first.identity.id, 0x02000001);
  assert.equal(identities.lookupById(0x02000001)?.labels, node);
  // Withheld local IDs are skipped by the scan and handed out when asked for by old ID.
  assert.deepEqual(identities.withholdLocal([0x01000001, 0x02000002, 77]), [77]);
  const cidr = await identities.allocate(Labels.parse(["cidr:10.0.0.0/8"]));
  assert.equal(cidr.identity.id, 0x01000002);
  const restored = await identities.allocate(Labels.parse(["cidr:10.0.0.1/32"]), {
    oldId: 0x01000001,
  });
  assert.equal(restored.identity.id, 0x01000001);
  identities.unwithholdLocal([0x02000002]);
  const second = await identities.allocate(Labels.parse(["reserved:remote-node", "node:n=2"]));
  assert.equal(second.identity.id, 0x02000002);
  assert.equal(await identities.release(first.identity), true);
  assert.equal(identities.lookupById(0x02000001), undefined);
  assert.equal((await fx.masters()).size, 0);
});

testEachBackend(
  "a held identity whose ID is given to other labels moves: owners see both",
  async (factory) => {
    await using fx = await factory.create();
    await using identities = await open(fx, "10.0.0.1");
    await using owner = new Owner(identities);
    const { identity } = await identities.allocate(lbls1);
    await owner.has(identity.id, lbls1);
    // A writer that ignores the protocol gives the identity's ID to other labels.
    const intruder = Labels.parse(["intruder=1"]);
    await fx.rewriteMaster(identity.id, intruder.toKvstoreString());
    await owner.has(identity.id, intruder);
    await owner.until(
      () => [...owner.cache].some(([id, l]) => id !== identity.id && l.equals(lbls1)),
      "the labels under a new ID",
    );
    // Lookups answer the new ID once the node has re-acquired it (the store's echo may be first).
    await eventually(() => (identities.lookup(lbls1)?.id ?? identity.id) !== identity.id, "lookup");
    const moved = identities.lookup(lbls1)!;
    assert.ok(identities.lookupById(moved.id)?.labels.equals(lbls1));
    // The old identity was never reported deleted after the intruder's add replaced it.
    const last = owner.batches.findLastIndex((b) => b.added.get(identity.id)?.equals(intruder));
    assert.ok(owner.batches.slice(last).every((b) => !b.deleted.has(identity.id)));
  },
);

testEachBackend(
  "releaseInBackground: a released identity's reference lands by flush",
  async (f) => {
    await using fx = await f.create();
    await using identities = await open(fx, "10.0.0.1", { releaseInBackground: true });
    const held = [lbls1, lbls2, lbls3];
    const ids = [];
    for (const labels of held) ids.push((await identities.allocate(labels)).identity);
    const refsOf = async () =>
      (await fx.references()).filter((r) => r.node === "10.0.0.1" && r.live);
    assert.equal((await refsOf()).length, 3);
    for (const identity of ids) assert.equal(await identities.release(identity), true);
    await identities.flush();
    assert.deepEqual(await refsOf(), [], "every reference deleted");
    // Allocated again: the same IDs (the masters stay until GC), and references again.
    for (const [i, labels] of held.entries()) {
      assert.equal((await identities.allocate(labels)).identity.id, ids[i].id);
    }
    await identities.flush();
    assert.equal((await refsOf()).length, 3);
  },
);
