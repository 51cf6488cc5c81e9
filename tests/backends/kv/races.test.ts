/**
 * Races at the commit point. A real KV file, with a hook that lets another node write just before
 * a session's next commit is sent (fault injection; the store itself is real).
 */
import assert from "node:assert/strict";
import { Clock, gcPass, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;

Deno.test("kv race: an acquire landing between GC's reads and its commit stops the delete", async () => {
  await using store = await TestStore.create();
  const { session: gc, hook } = await store.hookedSession("gc");
  const b = await store.session("b");
  const r = await b.acquire(request("k1", { first: 1 }));
  await b.release("k1", 1, never);
  const [c] = await gcPass(gc);
  assert.equal(c.inUse, false);
  // GC has read the touch counter and the (empty) references when b re-acquires the key.
  hook.before = async () => {
    await b.acquire(request("k1", { hint: { id: 1, version: r.version! } }));
  };
  assert.equal(await gc.gcDelete(c, never), false);
  assert.deepEqual(await store.fixture.masters(), new Map([[1, "k1"]]));
  assert.deepEqual((await store.fixture.references()).map((x) => [x.node, x.live]), [["b", true]]);
});

Deno.test("kv race: a lease replaced while an acquire's commit is in flight is followed", async () => {
  await using store = await TestStore.create();
  const clock = new Clock();
  let replaced = 0;
  const { session: a, hook } = await store.hookedSession("a", {
    now: clock.now,
    maxClockSkewMs: 1_000,
    leaseTtlMs: 10_000,
    onLeaseReplaced: () => replaced++,
  });
  const old = a.lease!.id;
  hook.before = async () => {
    clock.advance(20_000);
    await a.lease!.renewNow(); // too late to renew: replaced
  };
  const res = await a.acquire(request("k1", { first: 1 }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 1, created: true });
  assert.equal(replaced, 1);
  assert.notEqual(a.lease!.id, old);
  const ref = await store.kv.get<{ id: number; lease: string }>([...P, "ref", "k1", "a"]);
  assert.deepEqual(ref.value, { id: 1, lease: a.lease!.id });
});

Deno.test("kv race: GC deletes the master between an acquire's hint and its commit", async () => {
  await using store = await TestStore.create();
  const { session: a, hook } = await store.hookedSession("a");
  const gc = await store.session("gc");
  const r = await gc.acquire(request("k1", { first: 1 }));
  await gc.release("k1", 1, never);
  const [c] = await gcPass(gc);
  hook.before = async () => {
    assert.equal(await gc.gcDelete(c, never), true);
  };
  // a's cache still says k1 → 1 at r.version; the master is gone by the time a commits.
  const res = await a.acquire(request("k1", { first: 5, hint: { id: 1, version: r.version! } }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 5, created: true });
  assert.deepEqual(await store.fixture.masters(), new Map([[5, "k1"]]));
});
