/**
 * idalloc beside Cilium nodes on one etcd: every write honours Cilium's mutexes, so no
 * interleaving of a Cilium allocation or GC (driven step by step by a Cilium-protocol double)
 * with idalloc's allocate, join, ensure and GC gives a key two IDs. Each hazardous interleaving
 * is also shown to split the key with the guard turned off, so the tests can fail.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import { AllocationFailedError, KeyLockedError, SplitKeyError } from "../../../src/errors.ts";
import { type AllocateStep, CiliumDouble, finish, runUntil } from "../../_support/cilium_double.ts";
import { b } from "../../../src/backends/etcd/testing/fixture.ts";
import type { EtcdBackend } from "../../../src/backends/etcd/mod.ts";
import {
  assertOneIdPerKey,
  deadline,
  etcdTest,
  eventually,
  type Namespace,
  namespace,
  requestsDuring,
  storeView,
  withLease,
} from "./_helpers.ts";

const K = "k8s:app=web;k8s:io.kubernetes.pod.namespace=default;";
const OPTIONS = { min: 1, max: 65_535, leaseTtlMs: 5_000, backoff: { initialMs: 5, maxMs: 50 } };
/** Every step of a new-key Cilium allocation before it unlocks. */
const STEPS: AllocateStep[] = ["locked", "refs-read", "checked", "master-created", "ref-created"];

/** The backend of each allocator `idallocNode` opened, to count its transactions. */
const backends = new WeakMap<Allocator, EtcdBackend>();

async function idallocNode(ns: Namespace, node: string, honorCiliumLocks = true) {
  const backend = await ns.backend(node, { honorCiliumLocks });
  const alloc = await Allocator.open(backend, OPTIONS);
  backends.set(alloc, backend);
  return alloc;
}

/** The acquire transactions `alloc` has sent so far. */
function acquires(alloc: Allocator): number {
  return backends.get(alloc)!.requestStats().operations["acquire"] ?? 0;
}

/**
 * Resolves once `alloc` has sent two acquire transactions since it had sent `before`: the second
 * starts only after the first came back refused (a write that went through would have ended the
 * call), so by then idalloc has tried to write and has been turned away at least once.
 */
async function refusedOnce(alloc: Allocator, before: number): Promise<void> {
  await eventually(() => acquires(alloc) >= before + 2, "idalloc tried, was refused, tried again");
}

for (const step of STEPS) {
  etcdTest(
    `Cilium stopped after '${step}': idalloc's new-key allocation joins its ID`,
    async () => {
      await using ns = await namespace();
      await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
      await using alloc = await idallocNode(ns, "idalloc-a");
      await alloc.waitForInitialSync();
      const steps = cilium.allocateSteps(K, () => 1759);
      await runUntil(steps, step);
      const before = acquires(alloc);
      const pending = alloc.allocate(K, { signal: deadline() });
      // idalloc waits for the mutex: it has written nothing while Cilium is between its steps.
      await refusedOnce(alloc, before);
      assert.equal((await storeView(ns)).refIds.get(K)?.has(1759) ?? false, step === "ref-created");
      assert.equal((await ns.dump()).some((kv) => kv.key.endsWith("/idalloc-a")), false);
      const ciliumId = await finish(steps);
      const { id, isNew } = await pending;
      assert.deepEqual({ id, isNew }, { id: 1759, isNew: false });
      assert.equal(ciliumId, 1759);
      assert.deepEqual([...await assertOneIdPerKey(ns)], [[K, 1759]]);
    },
  );

  etcdTest(
    `Cilium stopped after '${step}': join, ensure and GC of the key keep one ID`,
    async () => {
      await using ns = await namespace();
      await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
      await using a = await idallocNode(ns, "idalloc-a");
      await using c = await idallocNode(ns, "idalloc-c");
      await using h = await idallocNode(ns, "idalloc-h");
      await Promise.all([a.waitForInitialSync(), c.waitForInitialSync(), h.waitForInitialSync()]);
      // K has an ID that node a released (a master for c to join and for a's GC to judge) and that
      // node h still holds, but h's reference vanished (a lost lease): Cilium finds no reference.
      const { id: old } = await a.allocate(K);
      assert.equal((await h.allocate(K)).id, old);
      await a.release(K);
      await ns.raw.kv.deleteRange({ key: b(ns.layout.refKey(K, "idalloc-h")) });
      await eventually(() => c.cachedId(K) === old, "node c's cache knows the master");
      assert.equal((await a.runGc()).marked, 1);
      const steps = cilium.allocateSteps(K, () => 40_000);
      await runUntil(steps, step);
      const joined = c.allocate(K, { signal: deadline() });
      const collected = a.runGc();
      await h.sync();
      await finish(steps);
      const { id } = await joined;
      await collected;
      await h.sync(); // finds Cilium's ID live for K: h moves there
      const stored = await assertOneIdPerKey(ns, { staleMasters: true });
      assert.equal(stored.get(K), id, "c agrees with the store");
      assert.equal(await h.get(K), id, "h agrees with the store");
      assert.equal(await cilium.get(K), id, "Cilium agrees with the store");
    },
  );
}

etcdTest(
  "without the guard, the same interleaving splits the key (until the fence moves it)",
  async () => {
    await using ns = await namespace();
    await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
    await using alloc = await idallocNode(ns, "idalloc-a", false);
    await alloc.waitForInitialSync();
    const moved = firstReassignment(alloc);
    const steps = cilium.allocateSteps(K, () => 1759);
    // Cilium read no reference and checked again; its master comes next.
    await runUntil(steps, "checked");
    const { id } = await alloc.allocate(K, { signal: deadline() });
    await finish(steps);
    assert.notEqual(id, 1759, "idalloc created its own master between Cilium's steps");
    // The key now has two live IDs; idalloc's fence moves over. (The re-check that Cilium's master
    // upsert set off may have run before Cilium's reference existed; the periodic pass would catch
    // it, this one does so now.)
    await alloc.sync();
    assert.deepEqual(await moved, { type: "reassigned", key: K, oldId: id, newId: 1759 });
    assert.deepEqual([...await assertOneIdPerKey(ns, { staleMasters: true })], [[K, 1759]]);
  },
);

/** The first `reassigned` event of `alloc` (within 20 s). */
async function firstReassignment(alloc: Allocator): Promise<unknown> {
  for await (const e of alloc.watch({ signal: deadline(20_000) })) {
    if (e.type === "reassigned") return e;
  }
}

etcdTest("join of an unreferenced master waits for a Cilium allocation of the key", async () => {
  for (const honor of [true, false]) {
    await using ns = await namespace();
    await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
    await using a = await idallocNode(ns, "idalloc-a", honor);
    await using c = await idallocNode(ns, "idalloc-c", honor);
    await Promise.all([a.waitForInitialSync(), c.waitForInitialSync()]);
    // Key K had ID `old`; every node released it, so its master waits for GC unreferenced.
    const { id: old } = await a.allocate(K);
    await a.release(K);
    await eventually(() => c.cachedId(K) === old, "node c's cache knows the old master");
    // Cilium found no reference and is about to create a new master; c joins the old one.
    const steps = cilium.allocateSteps(K, () => 40_000);
    await runUntil(steps, "checked");
    const before = acquires(c);
    const joined = c.allocate(K, { signal: deadline() });
    if (honor) await refusedOnce(c, before);
    else await joined;
    const ciliumId = await finish(steps);
    const { id } = await joined;
    const view = () => assertOneIdPerKey(ns, { staleMasters: true });
    if (honor) {
      assert.equal(id, ciliumId, "c joined Cilium's ID, not the stale master");
      assert.equal((await view()).get(K), ciliumId);
      assert.equal(c.status().fence.reassigned, 0);
    } else {
      // Without the guard c joins the stale master and the key splits, until c's fence moves it.
      assert.equal(id, old);
      // Cilium's master upsert already made c re-check K, but that re-check may have run between
      // Cilium's master and its reference (an unreferenced second master is no proof). The next
      // periodic pass (`syncIntervalMs`) sees the reference: run it now instead of waiting.
      await c.sync();
      await eventually(() => c.status().fence.reassigned === 1, "c had to move");
      assert.equal((await view()).get(K), ciliumId);
    }
  }
});

etcdTest(
  "ensure does not re-create a reference under a Cilium allocation; the key moves",
  async () => {
    await using ns = await namespace();
    await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
    await using alloc = await idallocNode(ns, "idalloc-a");
    const { id: held } = await alloc.allocate(K);
    const events: unknown[] = [];
    const watching = (async () => {
      for await (const e of alloc.watch({ signal: deadline(20_000) })) {
        if (e.type === "reassigned") {
          events.push(e);
          return;
        }
      }
    })();
    // The node's reference vanished (as with a lost lease); Cilium then sees no reference.
    await ns.raw.kv.deleteRange({ key: b(ns.layout.refKey(K, "idalloc-a")) });
    const steps = cilium.allocateSteps(K, () => 50_000);
    await runUntil(steps, "master-created");
    await alloc.sync();
    assert.equal(
      (await ns.dump()).some((kv) => kv.key.endsWith("/idalloc-a")),
      false,
      "nothing re-created while Cilium is between its steps",
    );
    await finish(steps);
    // The next sync finds Cilium's ID live for the key: the held key moves to it.
    await alloc.sync();
    await watching;
    assert.deepEqual(events, [{ type: "reassigned", key: K, oldId: held, newId: 50_000 }]);
    assert.equal(await alloc.get(K), 50_000);
    assert.equal(alloc.status().fence.reassigned, 1);
    assert.equal((await storeView(ns)).refIds.get(K)!.size, 1);
    await eventually(() => alloc.status().healthy, "the fence is down");
  },
);

etcdTest(
  "idalloc's GC does not delete a master while Cilium's allocation holds the key",
  async () => {
    await using ns = await namespace();
    await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
    await using alloc = await idallocNode(ns, "idalloc-a");
    // Master 7 of K, unreferenced, but Cilium still holds K locally: its allocation re-uses 7
    // (`lockedAllocate`'s branch for a key that the store lost and the node still has).
    await ns.raw.kv.put({ key: b(ns.layout.masterKey(7)), value: b(K) });
    cilium.local.set(K, 7);
    assert.equal((await alloc.runGc()).marked, 1);
    const steps = cilium.allocateSteps(K, () => 8);
    await runUntil(steps, "master-created"); // a no-op create: master 7 exists
    assert.equal((await alloc.runGc()).deleted, 0, "the key's mutex is held");
    assert.equal(await finish(steps), 7);
    assert.deepEqual([...await assertOneIdPerKey(ns)], [[K, 7]]);
  },
);

etcdTest("a join waits for Cilium's GC of the ID; it then allocates afresh", async () => {
  await using ns = await namespace();
  await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
  await using a = await idallocNode(ns, "idalloc-a");
  await using c = await idallocNode(ns, "idalloc-c");
  await Promise.all([a.waitForInitialSync(), c.waitForInitialSync()]);
  const { id: old } = await a.allocate(K);
  await a.release(K);
  await eventually(() => c.cachedId(K) === old, "node c's cache knows the master");
  const gc = cilium.gcSteps(old);
  await runUntil(gc, "refs-read"); // Cilium found no user of `old` and is about to delete it
  const before = acquires(c);
  const joined = c.allocate(K, { signal: deadline() });
  await refusedOnce(c, before);
  assert.equal((await ns.dump()).some((kv) => kv.key.endsWith("/idalloc-c")), false);
  assert.equal(await finish(gc), true);
  const { id, isNew } = await joined;
  // Whatever ID it got (the freed one may come back by hash), c created it after the deletion.
  assert.equal(isNew, true, "c never joined the master Cilium deleted");
  assert.deepEqual([...await assertOneIdPerKey(ns)], [[K, id]]);
});

etcdTest("another key's mutex under the same range costs one retry, never a wait", async () => {
  await using ns = await namespace();
  const backend = await ns.backend("idalloc-a");
  await using alloc = await Allocator.open(backend, OPTIONS);
  await alloc.waitForInitialSync();
  await withLease(ns.raw, 60, async (lease) => {
    // Cilium allocating `a;/b;` holds `locks/a;/b;/<lease>`: inside the range `locks/a;/`.
    await ns.raw.kv.put({ key: b(`${ns.layout.keyLockPath("a;/b;")}/1f`), value: b(""), lease });
    const { result, requests } = await requestsDuring(backend, () => alloc.allocate("a;"));
    assert.equal(result.isNew, true);
    assert.equal(requests, 2, "one failed transaction, then the guard 'unchanged since'");
    // The key's own mutex still stops it.
    await ns.raw.kv.put({ key: b(`${ns.layout.keyLockPath("x;")}/2f`), value: b(""), lease });
    await assert.rejects(
      alloc.allocate("x;", { signal: deadline(300) }),
      (e) => e instanceof DOMException && e.name === "TimeoutError",
    );
  });
});

etcdTest("a dead holder's mutex lapses with its lease and the allocation goes on", async () => {
  await using ns = await namespace();
  // A Cilium node that died holding the key's mutex: its 2 s lock lease is never renewed.
  await using dead = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-dead", {
    keepAlive: false,
    lockLeaseTtl: 2,
  });
  const steps = dead.allocateSteps(K, () => 1759);
  await runUntil(steps, "locked");
  await using alloc = await idallocNode(ns, "idalloc-a");
  const { id } = await alloc.allocate(K, { signal: deadline(15_000) });
  assert.equal((await ns.dump()).some((kv) => kv.key.includes("/locks/")), false);
  assert.deepEqual([...await assertOneIdPerKey(ns)], [[K, id]]);
  await steps.return(0).catch(() => {});
});

etcdTest("a mutex held past lockWaitMs fails the call with the lock as its cause", async () => {
  await using ns = await namespace();
  const backend = await ns.backend("idalloc-a");
  await using alloc = await Allocator.open(backend, { ...OPTIONS, lockWaitMs: 200 });
  await withLease(ns.raw, 60, async (lease) => {
    await ns.raw.kv.put({ key: b(`${ns.layout.keyLockPath(K)}/3f`), value: b(""), lease });
    await assert.rejects(
      alloc.allocate(K, { signal: deadline() }),
      (e) => e instanceof AllocationFailedError && e.cause instanceof KeyLockedError,
    );
  });
});

etcdTest("a split made by someone else is refused at once, naming both IDs", async () => {
  await using ns = await namespace();
  const backend = await ns.backend("idalloc-a");
  await using alloc = await Allocator.open(backend, OPTIONS);
  await withLease(ns.raw, 60, async (lease) => {
    await ns.raw.kv.put({ key: b(ns.layout.refKey(K, "cilium-a")), value: b("1759"), lease });
    await ns.raw.kv.put({ key: b(ns.layout.refKey(K, "cilium-b")), value: b("63759"), lease });
    const { requests } = await requestsDuring(backend, () =>
      assert.rejects(
        alloc.allocate(K, { signal: deadline() }),
        (e) => e instanceof SplitKeyError && e.ids.join() === "1759,63759",
      ));
    assert.ok(requests <= 2, `${requests} transactions, not 16 attempts`);
  });
});

etcdTest("2 Cilium doubles and 2 idalloc nodes race on 300 keys: one ID per key", async () => {
  await using ns = await namespace();
  await using c1 = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-1");
  await using c2 = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-2");
  await using i1 = await idallocNode(ns, "idalloc-1");
  await using i2 = await idallocNode(ns, "idalloc-2");
  const keys = Array.from({ length: 300 }, (_, i) => `k8s:race=${i};`);
  const shuffled = () => [...keys].sort(() => Math.random() - 0.5);
  const randomId = () => 1 + Math.floor(Math.random() * 65_535);
  const answers = new Map<string, Map<string, number>>();
  const run = async (node: string, allocate: (key: string) => Promise<number>) => {
    const mine = new Map<string, number>();
    answers.set(node, mine);
    const queue = shuffled();
    await Promise.all(Array.from({ length: 8 }, async () => {
      for (let key = queue.pop(); key !== undefined; key = queue.pop()) {
        mine.set(key, await allocate(key));
      }
    }));
  };
  await Promise.all([
    run("cilium-1", (k) => c1.allocate(k, randomId)),
    run("cilium-2", (k) => c2.allocate(k, randomId)),
    run("idalloc-1", async (k) => (await i1.allocate(k, { signal: deadline(60_000) })).id),
    run("idalloc-2", async (k) => (await i2.allocate(k, { signal: deadline(60_000) })).id),
  ]);
  const stored = await assertOneIdPerKey(ns);
  assert.equal(stored.size, keys.length);
  for (const [node, mine] of answers) {
    for (const [key, id] of mine) assert.equal(id, stored.get(key), `${node} agrees on ${key}`);
  }
});
