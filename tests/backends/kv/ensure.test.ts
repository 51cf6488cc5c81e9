import assert from "node:assert/strict";
import { held, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;

Deno.test("kv ensure: intact keys cost reads only", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 1 }));
  await a.acquire(request("k2", { first: 2 }));
  const before = { ...a.stats };
  const reports = await a.ensure([held("k1", 1), held("k2", 2)], never);
  assert.deepEqual(reports, [
    { key: "k1", id: 1, master: "ok", reference: "ok" },
    { key: "k2", id: 2, master: "ok", reference: "ok" },
  ]);
  assert.equal(a.stats.commits, before.commits);
  assert.equal(a.stats.reads - before.reads, 1, "two held keys in one snapshot read");
});

Deno.test("kv ensure: a deleted master pair and a deleted reference are re-created", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 1 }));
  await a.acquire(request("k2", { first: 2 }));
  await store.fixture.deleteMaster(1);
  await store.fixture.deleteReference("k2", "a");
  const gen = (await store.kv.get<Deno.KvU64>([...P, "gen"])).value!.value;
  const reports = await a.ensure([held("k1", 1), held("k2", 2)], never);
  assert.deepEqual(reports, [
    { key: "k1", id: 1, master: "recreated", reference: "ok" },
    { key: "k2", id: 2, master: "ok", reference: "recreated" },
  ]);
  assert.deepEqual(await store.fixture.masters(), new Map([[1, "k1"], [2, "k2"]]));
  const master = await store.kv.get([...P, "id", 1]);
  const index = await store.kv.get([...P, "key", "k1"]);
  assert.equal(master.versionstamp, index.versionstamp);
  assert.equal((await store.fixture.references()).filter((r) => r.live).length, 2);
  // The re-created master is announced on the change feed.
  assert.equal((await store.kv.get<Deno.KvU64>([...P, "gen"])).value!.value, gen + 1n);
});

Deno.test("kv ensure: an ID taken by another key is a conflict and nothing is written", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  await a.acquire(request("k1", { first: 1 }));
  await store.fixture.deleteMaster(1);
  await a.release("k1", 1, never);
  await b.acquire(request("other", { first: 1 })); // ID 1 now belongs to "other"
  const before = await store.dump();
  const [report] = await a.ensure([held("k1", 1)], never);
  assert.deepEqual(report, { key: "k1", id: 1, master: "conflict", reference: "skipped" });
  assert.deepEqual(await store.dump(), before);
});

Deno.test("kv ensure: a key now mapped to another ID is a conflict", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 3 }));
  const [report] = await a.ensure([held("k1", 4)], never);
  assert.deepEqual(report, { key: "k1", id: 4, master: "conflict", reference: "skipped" });
  assert.equal((await store.kv.get([...P, "id", 4])).versionstamp, null);
});

Deno.test("kv ensure: many held keys after a lease loss are re-written in batches", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const keys = Array.from({ length: 95 }, (_, i) => held(`k${i}`, i + 1));
  for (const k of keys) await a.acquire(request(k.key, { first: k.id }));
  await store.kv.delete([...P, "lease", "a"]);
  await a.lease!.renewNow(); // replaced: every reference is dead
  assert.equal((await store.fixture.references()).filter((r) => r.live).length, 0);
  const before = { ...a.stats };
  const reports = await a.ensure(keys, never);
  assert.ok(reports.every((r) => r.master === "ok" && r.reference === "recreated"));
  assert.equal(a.stats.commits - before.commits, 3, "one commit per batch of 40");
  assert.equal((await store.fixture.references()).filter((r) => r.live).length, 95);
});

Deno.test("kv ensure: large keys are split into commits within the store's key-size limit", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const big = (i: number) => `${i}-`.padEnd(1_900, "x");
  const keys = Array.from({ length: 40 }, (_, i) => held(big(i), i + 1));
  for (const k of keys) await a.acquire(request(k.key, { first: k.id }));
  await store.kv.delete([...P, "lease", "a"]);
  await a.lease!.renewNow();
  const reports = await a.ensure(keys, never);
  assert.ok(reports.every((r) => r.master === "ok" && r.reference === "recreated"));
  assert.equal((await store.fixture.references()).filter((r) => r.live).length, 40);
});
