import assert from "node:assert/strict";
import { never, request, TestStore } from "./_helpers.ts";

Deno.test("kv layout: a new key writes exactly master, index, ref, lease, log, gen; a join adds touch", async () => {
  await using store = await TestStore.create();
  const before = Date.now();
  const a = await store.session("node-a");
  const res = await a.acquire(request("app=web;", { first: 7 }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 7, created: true });

  const dump = await store.dump();
  const byKind = (kind: string) => dump.filter((e) => e.key[0] === kind);
  assert.deepEqual(
    dump.map((e) => e.key[0]).sort(),
    ["gen", "id", "key", "lease", "log", "ref"],
    "no touch entry: a new master's own versionstamp tells GC passes apart",
  );

  const [master] = byKind("id");
  const [index] = byKind("key");
  assert.deepEqual(master.key, ["id", 7]);
  assert.deepEqual(master.value, { key: "app=web;" });
  assert.deepEqual(index.key, ["key", "app=web;"]);
  assert.deepEqual(index.value, { id: 7 });
  // One commit: the master, its index and the reported version share one versionstamp.
  assert.equal(master.versionstamp, index.versionstamp);
  assert.equal(res.version, master.versionstamp);

  // A second node joining the key writes the touch entry, which a GC delete checks.
  const b = await store.session("node-b");
  await b.acquire(request("app=web;", { hint: { id: 7, version: res.version! } }));
  const [touch] = (await store.dump()).filter((e) => e.key[0] === "touch");
  assert.deepEqual(touch.key, ["touch", "app=web;"]);
  // Only its versionstamp matters; its value stays a counter for older writers that add to it.
  assert.equal((touch.value as Deno.KvU64).value, 0n);

  const [lease] = byKind("lease");
  const leaseValue = lease.value as { lease: string; expiresAt: number };
  assert.deepEqual(lease.key, ["lease", "node-a"]);
  assert.ok(leaseValue.expiresAt >= before + 60_000);

  const [ref] = byKind("ref");
  assert.deepEqual(ref.key, ["ref", "app=web;", "node-a"]);
  assert.deepEqual(ref.value, { id: 7, lease: leaseValue.lease });
  assert.equal(ref.versionstamp, master.versionstamp);

  const [log] = byKind("log");
  assert.equal(log.key.length, 4);
  assert.equal(typeof log.key[1], "number");
  assert.equal(log.key[2], "node-a");
  assert.deepEqual(log.value, { id: 7, key: "app=web;" });
  assert.equal(log.versionstamp, master.versionstamp);

  const [gen] = byKind("gen");
  assert.equal((gen.value as Deno.KvU64).value, 1n);
});

Deno.test("kv layout: a second node's acquire adds a ref and a touch, no master write", async () => {
  await using store = await TestStore.create();
  const a = await store.session("node-a");
  const b = await store.session("node-b");
  const first = await a.acquire(request("k"));
  const before = await store.dump();
  const second = await b.acquire(request("k", { hint: { id: first.id, version: first.version! } }));
  assert.deepEqual(second, { id: first.id, created: false, version: first.version });
  const after = await store.dump();
  const changed = after.filter((e) =>
    !before.some((b) =>
      JSON.stringify(b.key) === JSON.stringify(e.key) && b.versionstamp === e.versionstamp
    )
  );
  assert.deepEqual(changed.map((e) => e.key).sort(), [["ref", "k", "node-b"], ["touch", "k"]]);
  const touch = after.find((e) => e.key[0] === "touch")!;
  assert.ok(touch.value instanceof Deno.KvU64);
  await b.release("k", first.id, never);
  const released = await store.dump();
  assert.ok(!released.some((e) => e.key[0] === "ref" && e.key[2] === "node-b"));
  assert.ok(released.some((e) => e.key[0] === "ref" && e.key[2] === "node-a"));
  assert.ok(released.some((e) => e.key[0] === "id"), "release keeps the master");
});
