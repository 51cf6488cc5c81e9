// Node death, lease expiry, vanished references and masters, and GC racing allocation.
import assert from "node:assert/strict";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { assertStoreInvariants, eventually, keys, openNode } from "./_helpers.ts";
import { ChildNode } from "./_processes.ts";

testEachBackendAndMode(
  "a killed process: its references expire, GC reclaims only its IDs",
  async (f) => {
    await using fx = await f.create();
    await using survivor = await openNode(fx, "survivor", { max: 4096 });
    const shared = keys(5);
    const child = new ChildNode(fx.spec(), "doomed", 4096, 10, { hold: true, leaseTtlMs: 2_000 });
    try {
      const childIds = await child.ids(); // key0001..key0010
      for (const k of shared) {
        assert.equal((await survivor.allocate(k)).id, childIds[k]);
      }
      await child.kill();
      const onlyChild = keys(10).slice(5).map((k) => childIds[k]);
      // Lease expiry takes TTL (+ skew allowance); GC needs two passes after that.
      await eventually(
        async () => {
          await survivor.runGc();
          const masters = await fx.masters();
          return onlyChild.every((id) => !masters.has(id));
        },
        "the dead node's IDs are collected",
        30_000,
      );
      const masters = await fx.masters();
      for (const k of shared) assert.equal(masters.get(childIds[k]), k, `${k} survives`);
      for (const k of shared) assert.equal(await survivor.getNoCache(k), childIds[k]);
      await assertStoreInvariants(fx);
    } finally {
      await child[Symbol.asyncDispose]();
    }
  },
);

testEachBackendAndMode(
  "master-key protection: a deleted master is re-created, consumers see no delete",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    const { id } = await a.allocate("protected;");
    const events: string[] = [];
    const controller = new AbortController();
    const watching = (async () => {
      for await (const ev of a.watch({ signal: controller.signal })) events.push(ev.type);
    })();
    await eventually(() => events.includes("synced"), "watch synced");
    await fx.deleteMaster(id);
    await eventually(
      async () => (await fx.masters()).get(id) === "protected;",
      "master re-created",
    );
    assert.equal(a.cachedKey(id), "protected;");
    assert.ok(!events.includes("delete"), `no delete event: ${events}`);
    controller.abort();
    await watching;
    await assertStoreInvariants(fx);
  },
);

testEachBackendAndMode("without protection a deleted master is reported as deleted", async (f) => {
  await using fx = await f.create();
  await using a = await openNode(fx, "a", { max: 1000, masterKeyProtection: false });
  const { id } = await a.allocate("unprotected;");
  await eventually(() => a.cachedKey(id) === "unprotected;", "cached");
  await fx.deleteMaster(id);
  await eventually(() => a.cachedKey(id) === undefined, "the delete reaches the cache");
});

testEachBackendAndMode(
  "a vanished reference is re-created by the sync; a released one is not",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    const { id } = await a.allocate("held;");
    await a.allocate("dropped;");
    await fx.deleteReference("held;", "a");
    await a.release("dropped;");
    await a.sync();
    const refs = await fx.references();
    assert.deepEqual(
      refs.filter((r) => r.node === "a").map((r) => [r.key, r.id, r.live]),
      [["held;", id, true]],
    );
  },
);

testEachBackendAndMode(
  "release racing the periodic sync never resurrects a reference (#35451)",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    const names = keys(40, "churn");
    for (let round = 0; round < 3; round++) {
      await Promise.all(names.map((k) => a.allocate(k)));
      await Promise.all([a.sync(), ...names.map((k) => a.release(k)), a.sync()]);
      await a.sync();
      const mine = (await fx.references()).filter((r) => r.node === "a");
      assert.deepEqual(mine, [], `round ${round}: no reference survives its release`);
    }
  },
);

testEachBackendAndMode(
  "GC racing allocation never deletes an ID that was just acquired",
  async (f) => {
    await using fx = await f.create();
    await using gc = await openNode(fx, "gc", { max: 1000 });
    await using user = await openNode(fx, "user", { max: 1000 });
    const names = keys(20, "race");
    for (let round = 0; round < 4; round++) {
      // Unused keys, marked by a first pass.
      for (const k of names) await user.allocate(k);
      for (const k of names) await user.release(k);
      await gc.runGc();
      // The second pass races re-acquisition of the same keys.
      const [, acquired] = await Promise.all([
        gc.runGc(),
        Promise.all(names.map((k) => user.allocate(k))),
      ]);
      const masters = await fx.masters();
      for (const [i, k] of names.entries()) {
        assert.equal(
          masters.get(acquired[i].id),
          k,
          `round ${round}: ${k} held but its master is gone`,
        );
      }
      await assertStoreInvariants(fx);
      for (const k of names) await user.release(k);
    }
  },
);

testEachBackendAndMode("corrupt entries in the store are skipped, not fatal", async (f) => {
  await using fx = await f.create();
  await fx.plantCorruptEntries();
  await using a = await openNode(fx, "a", { max: 1000 });
  await a.waitForInitialSync();
  const r = await a.allocate("after-corruption;");
  assert.equal(r.isNew, true);
  assert.equal(await a.getById(r.id), "after-corruption;");
  await a.runGc();
  await a.runGc();
  await using b = await openNode(fx, "b", { max: 1000 });
  assert.equal((await b.allocate("after-corruption;")).id, r.id);
  await assertStoreInvariants(fx);
});
