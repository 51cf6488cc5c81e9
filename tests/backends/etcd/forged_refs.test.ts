/**
 * Garbage under the prefix never dictates a key's ID on etcd: a reference without a lease (any
 * writer can put one), one naming an ID outside the allocator's range, and a corrupt master of a
 * live key, which is repaired from the key's references instead of the key getting a second ID.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { Allocator } from "../../../mod.ts";
import { CorruptEntryError, InvalidIdError } from "../../../src/errors.ts";
import { b } from "../../../src/backends/etcd/testing/fixture.ts";
import {
  assertOneIdPerKey,
  deadline,
  etcdTest,
  namespace,
  openSession,
  picker,
  withLease,
} from "./_helpers.ts";

const OPTIONS = { min: 1, max: 1_000, leaseTtlMs: 5_000, backoff: { initialMs: 5, maxMs: 50 } };

etcdTest("references without a lease never dictate an ID, in range or not", async () => {
  await using ns = await namespace();
  const backend = await ns.backend("node-a");
  await using alloc = await Allocator.open(backend, OPTIONS);
  const forged: Array<[string, string]> = [
    ["k6;", "777"], // in range: would be taken as the key's ID
    ["k9;", "555"], // no master 555: would be created for the key
    ["k10;", "70000"], // outside [1, 1000]
    ["k11;", "0"], // not an ID
  ];
  for (const [key, value] of forged) {
    await ns.raw.kv.put({ key: b(ns.layout.refKey(key, "evil")), value: b(value) });
  }
  for (const [key, value] of forged) {
    const { id, isNew } = await alloc.allocate(key, { signal: deadline() });
    assert.notEqual(String(id), value, `${key} did not take the forged ${value}`);
    assert.ok(id >= 1 && id <= 1_000 && isNew);
  }
  const masters = (await ns.dump()).filter((kv) => ns.layout.idOfMasterKey(kv.key) !== undefined);
  assert.ok(!masters.some((kv) => kv.key.endsWith("/id/555")), "no master made for 555");
});

etcdTest("a leased reference outside the range is refused, never returned", async () => {
  await using ns = await namespace();
  const backend = await ns.backend("node-a");
  await using alloc = await Allocator.open(backend, OPTIONS);
  await withLease(ns.raw, 60, async (lease) => {
    await ns.raw.kv.put({ key: b(ns.layout.masterKey(70_000)), value: b("k10;") });
    await ns.raw.kv.put({ key: b(ns.layout.refKey("k10;", "other")), value: b("70000"), lease });
    await assert.rejects(
      alloc.allocate("k10;", { signal: deadline() }),
      (e) => e instanceof InvalidIdError && /outside this allocator's range/.test(e.message),
    );
  });
});

etcdTest("a corrupt master of a live key is repaired from its references", async () => {
  for (const garbage of [Buffer.from([0xff, 0xfe, 0x00]), b(""), b("k8s:nobody=1;")]) {
    await using ns = await namespace();
    // The key is live through a bare session's reference: no watch, so nothing reacts to the
    // corrupt master but the joiner (an allocator holding the key would see its master name
    // another key and move the key to a new ID before the joiner ran, when the machine is busy);
    // a long lease, so that a process starved for a few seconds does not lose it.
    await using holder = await openSession(await ns.backend("node-a"), { leaseTtlMs: 60_000 });
    const { id } = await holder.acquire({
      key: "live;",
      pickCandidate: picker(7),
      signal: deadline(),
    });
    await using allocC = await Allocator.open(await ns.backend("node-c"), OPTIONS);
    await ns.raw.kv.put({ key: b(ns.layout.masterKey(id)), value: garbage });
    const joined = await allocC.allocate("live;", { signal: deadline() });
    assert.deepEqual({ id: joined.id, isNew: joined.isNew }, { id, isNew: false }, "no second ID");
    assert.deepEqual([...await assertOneIdPerKey(ns)], [["live;", id]]);
  }
});

etcdTest(
  "a master naming a key that does hold the ID is a real conflict, not repaired",
  async () => {
    await using ns = await namespace();
    await withLease(ns.raw, 60, async (lease) => {
      // Two keys both claim ID 5 through live references; the master names the second.
      await ns.raw.kv.put({ key: b(ns.layout.masterKey(5)), value: b("second;") });
      await ns.raw.kv.put({ key: b(ns.layout.refKey("first;", "x")), value: b("5"), lease });
      await ns.raw.kv.put({ key: b(ns.layout.refKey("second;", "y")), value: b("5"), lease });
      const backend = await ns.backend("node-a");
      await using alloc = await Allocator.open(backend, OPTIONS);
      await assert.rejects(
        alloc.allocate("first;", { signal: deadline() }),
        (e) => e instanceof CorruptEntryError && !e.retryable,
      );
      assert.equal(await ns.raw.get(ns.layout.masterKey(5)).string(), "second;");
    });
  },
);

etcdTest("getNoCache answers the key's live ID, never a lease-less reference's", async () => {
  await using ns = await namespace();
  const backend = await ns.backend("node-a");
  await using alloc = await Allocator.open(backend, OPTIONS);
  const { id } = await alloc.allocate("held;");
  // Sorted before node-a's reference: the first one a naive reader would take.
  await ns.raw.kv.put({ key: b(ns.layout.refKey("held;", "a-ghost")), value: b("115399") });
  assert.equal(await alloc.getNoCache("held;"), id);
  await ns.raw.kv.put({ key: b(ns.layout.refKey("lonely;", "a-ghost")), value: b("7") });
  assert.equal(await alloc.getNoCache("lonely;"), undefined);
});
