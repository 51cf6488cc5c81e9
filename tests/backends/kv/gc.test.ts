import assert from "node:assert/strict";
import { gcPass, held, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;

Deno.test("kv gc: candidates carry master:touch versions and in-use flags, within range", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const r1 = await a.acquire(request("k1", { first: 1 }));
  await a.acquire(request("k2", { first: 2 }));
  await a.acquire(request("k3", { first: 30 }));
  await a.release("k2", 2, never);
  const list = await gcPass(a, 1, 10);
  assert.deepEqual(list.map((c) => [c.id, c.key, c.inUse]), [[1, "k1", true], [2, "k2", false]]);
  // A key only ever acquired new has no touch entry yet.
  assert.equal(list[0].version, `${r1.version}:-`);
  // A join writes it, and the version moves.
  const b = await store.session("b");
  await b.acquire(request("k1", { hint: { id: 1, version: r1.version! } }));
  const touch = await store.kv.get([...P, "touch", "k1"]);
  const [again] = await gcPass(a, 1, 1);
  assert.equal(again.version, `${r1.version}:${touch.versionstamp}`);
});

Deno.test("kv gc: an acquire between the list and the delete makes the delete fail", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  const r = await a.acquire(request("k1", { first: 1 }));
  await a.release("k1", 1, never);
  const [c1] = await gcPass(a);
  const [c2] = await gcPass(a);
  assert.equal(c1.inUse, false);
  assert.deepEqual(c1, c2);
  // b re-acquires the key after GC judged it unused twice.
  await b.acquire(request("k1", { hint: { id: 1, version: r.version! } }));
  assert.equal(await a.gcDelete(c2, never), false);
  assert.deepEqual(await store.fixture.masters(), new Map([[1, "k1"]]));
  // Even a release right after (no live ref, but the version moved) does not let the old
  // candidate through.
  await b.release("k1", 1, never);
  assert.equal(await a.gcDelete(c2, never), false);
  const [fresh] = await gcPass(a);
  assert.equal(await a.gcDelete(fresh, never), true);
  assert.equal((await store.fixture.masters()).size, 0);
});

Deno.test("kv gc: a live reference blocks the delete even with a matching version", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 1 }));
  const [c] = await gcPass(a);
  assert.equal(c.inUse, true);
  assert.equal(await a.gcDelete({ ...c, inUse: false }, never), false);
  assert.equal((await store.fixture.masters()).size, 1);
});

Deno.test("kv gc: a re-created reference (ensure) makes a pending delete fail", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 1 }));
  await store.fixture.deleteReference("k1", "a"); // the reference vanished
  const [c] = await gcPass(a);
  assert.equal(c.inUse, false);
  const [report] = await a.ensure([held("k1", 1)], never);
  assert.equal(report.reference, "recreated");
  assert.equal(await a.gcDelete(c, never), false);
  assert.equal((await store.fixture.masters()).size, 1);
});

Deno.test("kv gc: more dead references than one commit can check are all removed", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 1 }));
  await a.release("k1", 1, never);
  // 120 dead references: their nodes have no lease record.
  for (let i = 0; i < 120; i += 40) {
    const op = store.kv.atomic();
    for (let j = i; j < i + 40; j++) {
      op.set([...P, "ref", "k1", `ghost-${j}`], { id: 1, lease: "x" });
    }
    await op.commit();
  }
  const [c] = await gcPass(a);
  assert.equal(c.inUse, false);
  assert.equal(await a.gcDelete(c, never), true);
  const dump = await store.dump();
  assert.deepEqual(dump.filter((e) => e.key[0] === "ref" || e.key[0] === "id"), []);
});

Deno.test("kv gc: corrupt masters and references are skipped and left alone", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await store.fixture.plantCorruptEntries();
  await a.acquire(request("k1", { first: 1 }));
  await a.release("k1", 1, never);
  const list = await gcPass(a, 1, 100_000);
  assert.deepEqual(list.map((c) => c.id), [1]);
  assert.equal(await a.gcDelete(list[0], never), true);
  assert.deepEqual((await store.kv.get([...P, "id", 9_999])).value, "not an object");
  assert.equal((await store.kv.get([...P, "ref", "corrupt-key", "ghost"])).value, 42);
});

Deno.test("kv gc: many dead references of a large key stay within the key-size limit", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const key = "big-".padEnd(1_800, "x");
  await a.acquire(request(key, { first: 1 }));
  await a.release(key, 1, never);
  for (let i = 0; i < 60; i += 20) {
    const op = store.kv.atomic();
    for (let j = i; j < i + 20; j++) {
      op.set([...P, "ref", key, `ghost-${j}`], { id: 1, lease: "x" });
    }
    await op.commit();
  }
  const [c] = await gcPass(a);
  assert.equal(await a.gcDelete(c, never), true);
  assert.equal((await store.fixture.masters()).size, 0);
  assert.equal((await store.dump()).filter((e) => e.key[0] === "ref").length, 0);
});
