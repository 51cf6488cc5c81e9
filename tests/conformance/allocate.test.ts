// Cilium's kvstore allocator scenarios (spec §5.4) and the allocator API, on every backend.
import assert from "node:assert/strict";
import {
  AllocationFailedError,
  Allocator,
  InvalidKeyError,
  InvalidOptionsError,
  KeyNotHeldError,
  PoolExhaustedError,
} from "../../mod.ts";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { assertStoreInvariants, eventually, keys, openNode } from "./_helpers.ts";

testEachBackendAndMode(
  "TestAllocateCached: 32 keys, a second node, releases, GC to 32 then 0",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 32 });
    const names = keys(32);
    const ids = new Map<string, number>();
    for (const k of names) {
      const r = await a.allocate(k);
      assert.ok(r.id >= 1 && r.id <= 32);
      assert.equal(r.isNew, true, `${k} is new`);
      assert.equal(r.firstUse, true);
      ids.set(k, r.id);
    }
    assert.equal(new Set(ids.values()).size, 32, "IDs are unique");
    for (const k of names) {
      assert.deepEqual(await a.allocate(k), { id: ids.get(k), isNew: false, firstUse: false });
    }
    {
      await using r = await openNode(fx, "r", { max: 32 });
      for (const k of names) {
        assert.deepEqual(await r.allocate(k), { id: ids.get(k), isNew: false, firstUse: true });
      }
      for (const k of names) assert.deepEqual(await r.release(k), { lastUse: true });
    }
    for (const k of names) assert.deepEqual(await a.release(k), { lastUse: false });
    await a.runGc();
    await a.runGc();
    assert.equal((await fx.masters()).size, 32, "still referenced: nothing collected");
    for (const k of names) assert.deepEqual(await a.release(k), { lastUse: true });
    const first = await a.runGc();
    assert.equal(first.deleted, 0);
    assert.equal(first.marked, 32);
    assert.equal((await fx.masters()).size, 32, "one pass only marks");
    const second = await a.runGc();
    assert.equal(second.deleted, 32);
    assert.equal((await fx.masters()).size, 0);
    await eventually(() => [...a.entries()].length === 0, "the cache sees the deletions");
  },
);

/**
 * For the tests of what the cache shows: leases that outlast a starved machine's late renewals. A
 * renewal too late fences the held keys (`entries()` leaves them out until re-checked), which the
 * fencing tests cover; these are about the cache, not lapses.
 */
const STEADY = { min: 256, max: 65535, leaseTtlMs: 15_000 };

testEachBackendAndMode("allocate, get, getNoCache, getById, entries and watch agree", async (f) => {
  await using fx = await f.create();
  await using a = await openNode(fx, "a", STEADY);
  await using b = await openNode(fx, "b", STEADY);
  const { id, isNew, firstUse } = await a.allocate("app=web;");
  assert.ok(id >= 256 && id <= 65535);
  assert.equal(isNew, true);
  assert.equal(firstUse, true);
  assert.equal(await a.get("app=web;"), id);
  assert.equal(await a.getNoCache("app=web;"), id);
  assert.equal(await b.getNoCache("app=web;"), id);
  assert.equal(await b.get("app=web;"), id, "cache miss falls back to the store");
  assert.equal(await b.getById(id), "app=web;");
  assert.equal(await a.get("app=none;"), undefined);
  assert.equal(await a.getById(999), undefined);
  await eventually(() => b.cachedKey(id) === "app=web;", "b's cache hears of a's allocation");
  assert.deepEqual([...b.entries()], [[id, "app=web;"]]);

  const controller = new AbortController();
  const events: unknown[] = [];
  const watching = (async () => {
    for await (const ev of b.watch({ signal: controller.signal })) events.push(ev);
  })();
  await eventually(() => events.length === 2, "replay and synced");
  assert.deepEqual(events, [{ type: "upsert", id, key: "app=web;" }, { type: "synced" }]);
  const other = await a.allocate("app=db;");
  await eventually(() => events.length === 3, "a live upsert");
  assert.deepEqual(events[2], { type: "upsert", id: other.id, key: "app=db;" });
  await a.release("app=db;");
  await a.runGc();
  await a.runGc();
  await eventually(() => events.length === 4, "a live delete after GC");
  assert.deepEqual(events[3], { type: "delete", id: other.id, key: "app=db;" });
  controller.abort();
  await watching;
  await assertStoreInvariants(fx);
});

testEachBackendAndMode(
  "a node's own allocation is in entries() and watch() when allocate resolves, and once",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", STEADY);
    await using b = await openNode(fx, "b", STEADY);
    await a.waitForInitialSync();
    const controller = new AbortController();
    const live: unknown[] = [];
    const watching = (async () => {
      for await (const ev of a.watch({ signal: controller.signal })) live.push(ev);
    })();
    await eventually(() => live.length === 1, "synced");
    // No waiting between allocate and the reads: the README's snippet does exactly this.
    const { id } = await a.allocate("app=web;");
    assert.deepEqual([...a.entries()], [[id, "app=web;"]]);
    assert.equal(a.cachedKey(id), "app=web;");
    const replay: unknown[] = [];
    for await (const ev of a.watch()) {
      replay.push(ev);
      if (ev.type === "synced") break;
    }
    assert.deepEqual(replay, [{ type: "upsert", id, key: "app=web;" }, { type: "synced" }]);
    assert.deepEqual(live, [{ type: "synced" }, { type: "upsert", id, key: "app=web;" }]);
    // b writes after a did, so the store reports a's echo to a's watch before b's key: once b's
    // key is here, the echo has been applied, and it added no second upsert.
    const other = await b.allocate("app=db;");
    await eventually(() => live.length >= 3, "b's allocation reaches a");
    assert.deepEqual(live, [
      { type: "synced" },
      { type: "upsert", id, key: "app=web;" },
      { type: "upsert", id: other.id, key: "app=db;" },
    ]);
    assert.deepEqual([...a.entries()].sort(), [[id, "app=web;"], [other.id, "app=db;"]].sort());
    controller.abort();
    await watching;
  },
);

testEachBackendAndMode("a released key keeps its ID until GC, and gets it back", async (f) => {
  await using fx = await f.create();
  await using a = await openNode(fx, "a", { max: 1000 });
  const first = await a.allocate("k;");
  assert.deepEqual(await a.release("k;"), { lastUse: true });
  const again = await a.allocate("k;");
  assert.equal(again.id, first.id, "the unreferenced master is reused");
  assert.equal(again.isNew, false);
  assert.equal(again.firstUse, true);
  await assert.rejects(a.release("never;"), KeyNotHeldError);
});

testEachBackendAndMode("pool exhaustion ends in a typed error with the cause", async (f) => {
  await using fx = await f.create();
  await using a = await openNode(fx, "a", { min: 1, max: 3, maxAttempts: 2 });
  for (const k of ["a;", "b;", "c;"]) await a.allocate(k);
  await assert.rejects(a.allocate("d;"), (err: unknown) => {
    assert.ok(err instanceof AllocationFailedError);
    assert.ok(err.cause instanceof PoolExhaustedError, `cause: ${err.cause}`);
    return true;
  });
  assert.equal((await fx.masters()).size, 3);
});

testEachBackendAndMode(
  "bad input: options, empty and oversize keys, nothing written",
  async (f) => {
    await using fx = await f.create();
    const backend = await fx.backend("a", { fast: true });
    await assert.rejects(Allocator.open(backend, {} as never), InvalidOptionsError);
    await assert.rejects(Allocator.open(backend, { max: 10, min: 20 }), InvalidOptionsError);
    await using a = await openNode(fx, "a2", { max: 100 });
    await assert.rejects(a.allocate(""), InvalidKeyError);
    await assert.rejects(a.allocate("x".repeat(4 * 1024 * 1024)), InvalidKeyError);
    await assert.rejects(a.allocate(42 as unknown as string), InvalidKeyError);
    assert.equal((await fx.masters()).size, 0);
    assert.equal((await fx.references()).length, 0);
    const ok = await a.allocate("fine;");
    assert.equal(ok.isNew, true);
  },
);

testEachBackendAndMode(
  "an aborted signal rejects with its reason and leaves the store consistent",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    const already = AbortSignal.abort(new Error("no"));
    await assert.rejects(a.allocate("k1;", { signal: already }), { message: "no" });
    // Abort at every point of an allocation: whatever happened, the store keeps its invariants and
    // the key is either fully held (reference + master) or not held at all.
    for (let i = 0; i < 30; i++) {
      const controller = new AbortController();
      const pending = a.allocate(`k${i};`, { signal: controller.signal });
      setTimeout(() => controller.abort(new Error("cut")), i % 5);
      try {
        await pending;
      } catch (err) {
        assert.equal((err as Error).message, "cut");
      }
    }
    await assertStoreInvariants(fx);
    for (let i = 0; i < 30; i++) {
      const r = await a.allocate(`k${i};`);
      assert.equal(await a.getNoCache(`k${i};`), r.id);
    }
    await assertStoreInvariants(fx);
  },
);
