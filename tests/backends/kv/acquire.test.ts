import assert from "node:assert/strict";
import { ClosedError, PoolExhaustedError, ReadOnlyError } from "../../../src/errors.ts";
import type { KvStats } from "../../../src/backends/kv/client.ts";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { DenoKvBackend } from "../../../src/backends/kv/mod.ts";
import { hooked, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;

function delta(after: KvStats, before: KvStats): KvStats {
  return {
    reads: after.reads - before.reads,
    lists: after.lists - before.lists,
    commits: after.commits - before.commits,
  };
}

Deno.test("kv acquire: a new key is one commit and no read", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const before = { ...a.stats };
  const res = await a.acquire(request("k1"));
  assert.equal(res.created, true);
  assert.deepEqual(delta(a.stats, before), { reads: 0, lists: 0, commits: 1 });
});

Deno.test("kv acquire: an existing key with a correct hint is one commit and no read", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  const first = await a.acquire(request("k1", { first: 5 }));
  const before = { ...b.stats };
  const res = await b.acquire(request("k1", { hint: { id: 5, version: first.version! } }));
  assert.deepEqual(res, { id: 5, created: false, version: first.version });
  assert.deepEqual(delta(b.stats, before), { reads: 0, lists: 0, commits: 1 });
});

Deno.test("kv acquire: an existing key without a hint costs one read and one more commit", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  const first = await a.acquire(request("k1", { first: 5 }));
  const before = { ...b.stats };
  // b's cache knows nothing: its candidate is 1, its new-key commit fails on the key index.
  const res = await b.acquire(request("k1"));
  assert.deepEqual(res, { id: 5, created: false, version: first.version });
  assert.deepEqual(delta(b.stats, before), { reads: 1, lists: 0, commits: 2 });
  assert.deepEqual(await store.fixture.masters(), new Map([[5, "k1"]]));
});

Deno.test("kv acquire: a stale hint falls back to the key index", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const first = await a.acquire(request("k1", { first: 5 }));
  const before = { ...a.stats };
  const stale = "00000000000000000001";
  const res = await a.acquire(request("k1", { hint: { id: 5, version: stale } }));
  assert.deepEqual(res, { id: 5, created: false, version: first.version });
  assert.deepEqual(delta(a.stats, before), { reads: 1, lists: 0, commits: 2 });

  // A hint naming the wrong ID: the index names the right one.
  const wrong = await a.acquire(request("k1", { hint: { id: 9, version: first.version! } }));
  assert.equal(wrong.id, 5);
});

Deno.test("kv acquire: a hint for a collected ID takes the new-key path", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const first = await a.acquire(request("k1", { first: 5 }));
  await a.release("k1", 5, never);
  await store.fixture.deleteMaster(5);
  const res = await a.acquire(
    request("k1", { first: 8, hint: { id: 5, version: first.version! } }),
  );
  assert.deepEqual({ id: res.id, created: res.created }, { id: 8, created: true });
  assert.deepEqual(await store.fixture.masters(), new Map([[8, "k1"]]));
});

Deno.test("kv acquire: a taken candidate is excluded and the next one is used", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("other", { first: 1 }));
  const seen: ReadonlySet<number>[] = [];
  const res = await a.acquire(request("k1", { first: 1, seen }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 2, created: true });
  assert.deepEqual(seen.map((s) => [...s]), [[], [1]]);
});

Deno.test("kv acquire: an exhausted pool is a PoolExhaustedError", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("one", { first: 1, max: 1 }));
  await assert.rejects(a.acquire(request("two", { first: 1, max: 1 })), PoolExhaustedError);
  assert.deepEqual(await store.fixture.masters(), new Map([[1, "one"]]));
});

Deno.test("kv acquire: a stale unreferenced master is reused, never duplicated", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  await a.acquire(request("k1", { first: 3 }));
  await a.release("k1", 3, never);
  assert.equal((await store.fixture.references()).length, 0);
  // b's cache has no hint and would pick 1: the key index sends it to 3.
  const res = await b.acquire(request("k1", { first: 1 }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 3, created: false });
  assert.deepEqual(await store.fixture.masters(), new Map([[3, "k1"]]));
});

Deno.test("kv acquire: nodes racing on one new key agree on one ID", async () => {
  await using store = await TestStore.create();
  const sessions = await Promise.all(["a", "b", "c", "d"].map((n) => store.session(n)));
  const keys = Array.from({ length: 60 }, (_, i) => `key-${i}`);
  // Every node picks the same first candidate for a key (as the allocator's hashing does), and
  // nodes race on every key at once.
  const results = await Promise.all(
    sessions.flatMap((s) =>
      keys.map((k, i) => s.acquire(request(k, { first: 1 + i * 3 })).then((r) => ({ k, ...r })))
    ),
  );
  const idOf = new Map<string, number>();
  for (const r of results) {
    assert.equal(idOf.get(r.k) ?? r.id, r.id, `key ${r.k} got two IDs`);
    idOf.set(r.k, r.id);
  }
  assert.equal(new Set(idOf.values()).size, keys.length, "IDs are unique");
  const created = results.filter((r) => r.created).length;
  assert.equal(created, keys.length, "each master created exactly once");
  const masters = await store.fixture.masters();
  assert.equal(masters.size, keys.length);
  for (const [k, id] of idOf) assert.equal(masters.get(id), k);
  assert.equal((await store.fixture.references()).length, keys.length * sessions.length);
});

Deno.test("kv acquire: a master deleted under its key index is re-created with the same ID", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const first = await a.acquire(request("k1", { first: 4 }));
  await store.kv.delete([...P, "id", 4]); // store damage: only the master is gone
  const res = await a.acquire(
    request("k1", { first: 9, hint: { id: 4, version: first.version! } }),
  );
  assert.deepEqual({ id: res.id, created: res.created }, { id: 4, created: true });
  const master = await store.kv.get([...P, "id", 4]);
  const index = await store.kv.get([...P, "key", "k1"]);
  assert.deepEqual(master.value, { key: "k1" });
  assert.equal(master.versionstamp, index.versionstamp);
});

Deno.test("kv acquire: a master without its key index is adopted, not duplicated", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await store.kv.set([...P, "id", 6], { key: "k1" });
  // The cache (say) knows ID 6 is taken and picks 6 first anyway: the read shows it is k1's.
  const res = await a.acquire(request("k1", { first: 6 }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 6, created: false });
  const index = await store.kv.get([...P, "key", "k1"]);
  const master = await store.kv.get([...P, "id", 6]);
  assert.deepEqual(index.value, { id: 6 });
  assert.equal(master.versionstamp, index.versionstamp);
});

Deno.test("kv acquire: a key index naming another key's master is dropped", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("other", { first: 2 }));
  await store.kv.set([...P, "key", "k1"], { id: 2 }); // bad index: 2 belongs to "other"
  const res = await a.acquire(request("k1", { first: 1 }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 1, created: true });
  assert.deepEqual(await store.fixture.masters(), new Map([[1, "k1"], [2, "other"]]));
});

Deno.test("kv acquire: a corrupt key index that nobody holds is dropped; a new ID", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await store.kv.set([...P, "key", "k1"], "garbage");
  const r = await a.acquire(request("k1", { first: 4 }));
  assert.deepEqual({ id: r.id, created: r.created }, { id: 4, created: true });
  assert.deepEqual((await store.kv.get([...P, "key", "k1"])).value, { id: 4 });
  assert.deepEqual(await store.fixture.masters(), new Map([[4, "k1"]]));
});

Deno.test("kv acquire: an aborted signal rejects with its reason and writes nothing", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const ctl = new AbortController();
  ctl.abort(new DOMException("stop", "AbortError"));
  await assert.rejects(a.acquire(request("k1", { signal: ctl.signal })), { name: "AbortError" });
  assert.equal((await store.fixture.masters()).size, 0);
});

Deno.test("kv session: get, getById, read-only and closed sessions", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const r = await store.session("r", { readOnly: true });
  await a.acquire(request("k1", { first: 3 }));
  assert.equal(await r.get("k1", never), 3);
  assert.equal(await r.get("nope", never), undefined);
  assert.equal(await r.getById(3, never), "k1");
  assert.equal(await r.getById(4, never), undefined);
  assert.equal((await store.kv.get([...P, "lease", "r"])).versionstamp, null, "no lease");
  await assert.rejects(r.acquire(request("k2")), ReadOnlyError);
  await assert.rejects(r.release("k1", 3, never), ReadOnlyError);
  assert.equal(r.status().leases, 0);
  const status = a.status();
  assert.equal(status.backend, "deno-kv");
  assert.equal(status.node, "a");
  assert.equal(status.leases, 1);
  assert.equal(status.healthy, true);
  assert.ok(status.leaseExpiresAt! > Date.now());
  await a.close();
  await assert.rejects(a.acquire(request("k3")), ClosedError);
  assert.equal(a.status().healthy, false);
});

Deno.test("kv acquire: a hint that is not a versionstamp is ignored", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 5 }));
  const res = await a.acquire(request("k1", { hint: { id: 5, version: "42" } }));
  assert.deepEqual({ id: res.id, created: res.created }, { id: 5, created: false });
});

Deno.test("kv allocate: a create whose answer was lost is reported new once, by the retry", async () => {
  await using store = await TestStore.create();
  const { kv, hook } = hooked(await store.handle());
  const backend = new DenoKvBackend(kv, { prefix: P, node: "a", pollIntervalMs: 20 });
  // No background commit (lease renewal, sync) between arming the hook and the allocation's.
  const options = { max: 1000, leaseTtlMs: 600_000, syncIntervalMs: 600_000 };
  await using a = await Allocator.open(backend, options);
  await a.waitForInitialSync();
  let landed = false;
  hook.after = (res) => {
    landed = res.ok;
    throw new TypeError("connection reset by peer (the commit's answer is lost)");
  };
  const first = await a.allocate("web");
  assert.equal(landed, true, "the create landed in the store");
  assert.deepEqual(await store.fixture.masters(), new Map([[first.id, "web"]]));
  assert.deepEqual(first, { id: first.id, isNew: true, firstUse: true });

  // Nobody else reports it new: not another node, nor this one again after a release.
  await using b = await Allocator.open(await store.backend("b"), { max: 1000 });
  assert.deepEqual(await b.allocate("web"), { id: first.id, isNew: false, firstUse: true });
  await a.release("web");
  assert.deepEqual(await a.allocate("web"), { id: first.id, isNew: false, firstUse: true });
});
