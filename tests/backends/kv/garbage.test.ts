// Garbage in a Deno KV store (issue 13), at the session level: counters never trusted blindly,
// commits never half-applied, keys' IDs decided only by valid entries in range, GC skipping what
// it cannot read, and the damage report with its guarded removal.
import assert from "node:assert/strict";
import type { AcquireRequest } from "../../../src/allocator/backend.ts";
import {
  CorruptEntryError,
  InvalidIdError,
  InvalidOptionsError,
  LiveEntryError,
  SplitKeyError,
  StoreUnavailableError,
} from "../../../src/errors.ts";
import { type DamageFinding, encodeToken, type GcSkip } from "../../../src/allocator/damage.ts";
import { commit, newStats } from "../../../src/backends/kv/client.ts";
import { held, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;
const GEN = [...P, "gen"];

/** `request(key, options)` limited to IDs `[min, max]`. */
function inRange(
  key: string,
  min: number,
  max: number,
  options: Parameters<typeof request>[1] = {},
): AcquireRequest {
  return { ...request(key, { first: min, max, ...options }), range: { min, max } };
}

/** A live lease record of node `node` with lease id `lease`, and its reference to `key` → `id`. */
async function liveRef(store: TestStore, key: string, node: string, id: number): Promise<void> {
  const lease = `lease-${node}`;
  await store.kv.atomic()
    .set([...P, "lease", node], { lease, expiresAt: Date.now() + 60_000 })
    .set([...P, "ref", key, node], { id, lease })
    .commit();
}

async function value(store: TestStore, key: Deno.KvKey): Promise<unknown> {
  return (await store.kv.get(key)).value;
}

Deno.test("kv garbage: a sum on garbage is a CorruptEntryError, not a retryable store error", async () => {
  await using store = await TestStore.create();
  await store.kv.set(GEN, "x");
  const err = await commit(newStats(), store.kv.atomic().sum(GEN, 1n), never).then(
    () => assert.fail("the commit must fail"),
    (e: unknown) => e,
  );
  assert.ok(err instanceof CorruptEntryError, String(err));
  assert.ok(!(err instanceof StoreUnavailableError));
  assert.equal(err.retryable, false);
});

Deno.test("kv garbage: a corrupt gen is repaired under a guard; the commit lands once, whole", async () => {
  await using store = await TestStore.create();
  const { session, hook } = await store.hookedSession("a");
  await store.kv.set(GEN, "x");
  // Between the failed commit and the repair, another writer fixes gen itself: the repair's guard
  // fails (its value wins), and the retried acquire adds to it.
  hook.before = () => {
    hook.before = () => store.kv.set(GEN, new Deno.KvU64(7n)).then(() => {});
    return Promise.resolve();
  };
  const r = await session.acquire(request("k1", { first: 3 }));
  assert.deepEqual({ id: r.id, created: r.created }, { id: 3, created: true });
  assert.deepEqual(await value(store, GEN), new Deno.KvU64(8n));
  const dump = await store.dump();
  assert.equal(dump.filter((e) => e.key[0] === "log").length, 1, "one change-feed entry");
  assert.deepEqual(await store.fixture.masters(), new Map([[3, "k1"]]));
});

Deno.test("kv garbage: a gen corrupted again before the retry fails typed, writing nothing", async () => {
  await using store = await TestStore.create();
  const { session, hook } = await store.hookedSession("a");
  await store.kv.set(GEN, "x");
  // Acquire (fails), repair (passes), retry: garbage again just before it.
  hook.before = () => {
    hook.before = () => {
      hook.before = () => store.kv.set(GEN, "y").then(() => {});
      return Promise.resolve();
    };
    return Promise.resolve();
  };
  await assert.rejects(session.acquire(request("k1")), (err: unknown) => {
    assert.ok(err instanceof CorruptEntryError && !err.retryable, String(err));
    return true;
  });
  const kinds = (await store.dump()).map((e) => e.key[0]).sort();
  assert.deepEqual(kinds, ["gen", "lease"], "no master, index, touch, reference or log entry");
});

Deno.test("kv garbage: a corrupt touch entry never blocks a key; a join and ensure overwrite it", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  await store.kv.set([...P, "touch", "k1"], "x");
  const r = await a.acquire(request("k1", { first: 2 }));
  assert.equal(r.created, true);
  await b.acquire(request("k1", { hint: { id: 2, version: r.version! } }));
  assert.ok(await value(store, [...P, "touch", "k1"]) instanceof Deno.KvU64);
  await store.kv.set([...P, "touch", "k1"], { not: "a counter" });
  await store.fixture.deleteReference("k1", "a");
  const [report] = await a.ensure([held("k1", 2)], never);
  assert.equal(report.reference, "recreated");
  assert.ok(await value(store, [...P, "touch", "k1"]) instanceof Deno.KvU64);
});

Deno.test("kv garbage: a corrupt index of a live key is rewritten from its live references", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const b = await store.session("b");
  await a.acquire(request("k1", { first: 40 }));
  await store.kv.set([...P, "key", "k1"], "garbage");
  const r = await b.acquire(request("k1", { first: 41 }));
  assert.deepEqual({ id: r.id, created: r.created }, { id: 40, created: false });
  assert.deepEqual(await value(store, [...P, "key", "k1"]), { id: 40 });
  // Both the index and the master corrupt: still the live ID, the pair rewritten.
  await store.kv.set([...P, "key", "k1"], { id: "forty" });
  await store.kv.set([...P, "id", 40], 40);
  const c = await store.session("c");
  assert.equal((await c.acquire(request("k1", { first: 42 }))).id, 40);
  assert.deepEqual(await store.fixture.masters(), new Map([[40, "k1"]]));
});

Deno.test("kv garbage: dead references never dictate; disagreeing live ones are a split", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  // A reference whose node has no lease record, under a corrupt index: nobody holds the key.
  await store.kv.set([...P, "ref", "k1", "ghost"], { id: 500, lease: "gone" });
  await store.kv.set([...P, "key", "k1"], "garbage");
  const r = await a.acquire(request("k1", { first: 7 }));
  assert.deepEqual({ id: r.id, created: r.created }, { id: 7, created: true });
  // Two live references naming different IDs under a corrupt index: refused, nothing written.
  await liveRef(store, "k2", "x", 20);
  await liveRef(store, "k2", "y", 21);
  await store.kv.set([...P, "key", "k2"], "garbage");
  await assert.rejects(a.acquire(request("k2", { first: 9 })), SplitKeyError);
  assert.equal(await value(store, [...P, "key", "k2"]), "garbage");
});

Deno.test("kv garbage: an index naming an ID outside the range never becomes the key's ID", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  // No master: the old code re-created master 70000 for it.
  await store.kv.set([...P, "key", "k1"], { id: 70_000 });
  const r1 = await a.acquire(inRange("k1", 1, 1000));
  assert.deepEqual({ id: r1.id, created: r1.created }, { id: 1, created: true });
  assert.equal(await value(store, [...P, "id", 70_000]), null);
  // A stale pair outside the range that nobody holds, even offered as the hint: a new ID.
  const stale = await a.acquire(request("k2", { first: 70_001 }));
  await a.release("k2", stale.id, never);
  const r2 = await a.acquire(
    inRange("k2", 1, 1000, { hint: { id: 70_001, version: stale.version! } }),
  );
  assert.ok(r2.id >= 1 && r2.id <= 1000, `${r2.id}`);
  // Held outside the range by a live node: refused (a typed error), nothing rewritten.
  const held70k = await a.acquire(request("k3", { first: 70_002 }));
  const b = await store.session("b");
  await assert.rejects(b.acquire(inRange("k3", 1, 1000)), InvalidIdError);
  assert.deepEqual(await value(store, [...P, "key", "k3"]), { id: held70k.id });
  // A live reference outside the range never dictates either: the valid index decides.
  const r4 = await a.acquire(inRange("k4", 1, 1000, { first: 30 }));
  await liveRef(store, "k4", "x", 80_000);
  assert.equal((await b.acquire(inRange("k4", 1, 1000, { first: 31 }))).id, r4.id);
});

Deno.test("kv garbage: ensure rewrites an unreadable pair it holds, not one owned elsewhere", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 5 }));
  await store.kv.set([...P, "id", 5], "garbage");
  await store.kv.set([...P, "key", "k1"], { id: -1 });
  const [repaired] = await a.ensure([held("k1", 5)], never);
  assert.deepEqual([repaired.master, repaired.reference], ["recreated", "ok"]);
  assert.deepEqual(await store.fixture.masters(), new Map([[5, "k1"]]));
  assert.deepEqual(await value(store, [...P, "key", "k1"]), { id: 5 });
  await store.kv.set([...P, "id", 5], { key: "other" });
  const [conflict] = await a.ensure([held("k1", 5)], never);
  assert.equal(conflict.master, "conflict");
  assert.deepEqual(await value(store, [...P, "id", 5]), { key: "other" });
});

Deno.test("kv garbage: GC skips and reports what it cannot read, and collects the rest", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await store.kv.set([...P, "id", 3], { key: "k".repeat(60_000) });
  await store.kv.set([...P, "id", 4], "garbage");
  await a.acquire(request("k1", { first: 1 }));
  await a.release("k1", 1, never);
  // An unreadable reference of k1 neither keeps it in use nor stops the pass.
  await store.kv.set([...P, "ref", "k1", "junk"], "not a reference");
  const skipped: GcSkip[] = [];
  const candidates = [];
  for await (const c of a.gcList({ min: 1, max: 10 }, never, { onSkip: (s) => skipped.push(s) })) {
    candidates.push(c);
  }
  assert.deepEqual(candidates.map((c) => [c.id, c.inUse]), [[1, false]]);
  assert.deepEqual(
    skipped.map((s) => s.kind).sort(),
    ["master-oversized", "master-undecodable", "reference-undecodable"],
  );
  assert.ok(skipped.every((s) => s.entry.length < 400), "huge entries shown shortened");
  assert.equal(await a.gcDelete(candidates[0], never), true);
  const crafted = { id: 3, key: "k".repeat(60_000), version: "x:-", inUse: false };
  assert.equal(await a.gcDelete(crafted, never), false);
  assert.equal(await a.get("k".repeat(60_000), never), undefined);
});

Deno.test("kv garbage: the damage report finds orphan indexes, bad counters, leases, ranges", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("ok", { first: 1 }));
  await a.acquire(request("mine", { first: 2 }));
  await store.kv.atomic()
    .set([...P, "key", "no-master"], { id: 3 })
    .set([...P, "key", "elsewhere"], { id: 2 })
    .set([...P, "key", "far"], { id: 90_000 })
    .set([...P, "touch", "ok"], "x")
    .set([...P, "lease", "broken"], { lease: 1 })
    .set([...P, "ref", "ok", "far-node"], { id: 90_000, lease: "l" })
    .commit();
  const backend = await store.backend("doctor");
  const found: DamageFinding[] = [];
  for await (const f of backend.findDamage({ range: { min: 1, max: 1000 } })) found.push(f);
  assert.deepEqual(
    found.map((f) => [f.kind, f.key ?? null]),
    [
      ["index-orphan", "elsewhere"],
      ["index-orphan", "far"],
      ["index-orphan", "no-master"],
      ["counter-wrong-type", "ok"],
      ["reference-out-of-range", "ok"],
      ["lease-undecodable", null],
    ],
  );
  // Without a range, an ID outside one is nobody's damage (the index of "far" still names no
  // master).
  const anyRange: DamageFinding[] = [];
  for await (const f of backend.findDamage()) anyRange.push(f);
  assert.deepEqual(
    anyRange.map((f) => f.kind),
    ["index-orphan", "index-orphan", "index-orphan", "counter-wrong-type", "lease-undecodable"],
  );
  // Tokens survive JSON (another process may act on a listing); a token naming a key outside
  // the prefix is refused.
  const [first] = JSON.parse(JSON.stringify(found)) as DamageFinding[];
  assert.equal(await backend.removeDamage(first), true);
  assert.equal(await value(store, [...P, "key", "elsewhere"]), null);
  assert.equal(await backend.removeDamage(first), false, "gone: nothing to remove");
  const outside = encodeToken("deno-kv", {
    key: [{ s: "elsewhere" }, { s: "id" }, { n: 1 }],
    versionstamp: "00000000000000010000",
    kind: "master-undecodable",
  });
  await assert.rejects(backend.removeDamage({ token: outside }), InvalidOptionsError);
  await assert.rejects(backend.removeDamage({ token: found[1].token + "x" }), InvalidOptionsError);
});

Deno.test("kv garbage: removing an oversized master tells the watchers at once", async () => {
  await using store = await TestStore.create();
  const watcher = await store.session("w", { readOnly: true });
  await store.kv.set([...P, "id", 9], { key: "k".repeat(60_000) });
  const ctl = new AbortController();
  const events: string[] = [];
  const watching = (async () => {
    for await (const ev of watcher.watch(ctl.signal)) {
      events.push(ev.type === "upsert" || ev.type === "delete" ? `${ev.type} ${ev.id}` : ev.type);
    }
  })();
  const until = async (what: string) => {
    for (let i = 0; i < 500 && !events.includes(what); i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.ok(events.includes(what), `${what} in ${events}`);
  };
  await until("synced");
  assert.ok(events.includes("upsert 9"), "an oversized master still holds its ID");
  const backend = await store.backend("doctor");
  for await (const f of backend.findDamage()) await backend.removeDamage(f);
  await until("delete 9");
  ctl.abort();
  await watching;
});

Deno.test("kv garbage: an index out of every range is index-out-of-range; a second range is valid", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("low", { first: 5 }));
  await a.acquire(request("high", { first: 2_000 }));
  const backend = await store.backend("doctor");
  const scan = async (options: Parameters<typeof backend.findDamage>[0]) => {
    const out: DamageFinding[] = [];
    for await (const f of backend.findDamage(options)) out.push(f);
    return out.map((f) => [f.kind, f.key, f.heldBy]);
  };
  // Its master is there and is the key's: only the range is wrong, and a live node holds it.
  assert.deepEqual(await scan({ range: { min: 1, max: 1000 } }), [
    ["index-out-of-range", "high", ["a"]],
    ["reference-out-of-range", "high", ["a"]],
  ]);
  // A prefix that holds two valid ranges reports neither's IDs.
  assert.deepEqual(await scan({ ranges: [{ min: 1, max: 1000 }, { min: 1500, max: 2500 }] }), []);
  assert.deepEqual(
    await scan({ ranges: (key) => [{ min: 1, max: key === "high" ? 3000 : 10 }] }),
    [],
  );
});

Deno.test("kv garbage: what a live node holds is reported with its holder and never removed", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  const { id } = await a.acquire(request("held", { first: 7 }));
  await store.kv.atomic()
    .set([...P, "id", id], "garbage") // the master of a live key
    .set([...P, "touch", "held"], "x") // its touch counter
    .set([...P, "ref", "other", "a"], "not a reference") // a live node's unreadable reference
    .set([...P, "ref", "other", "gone"], "not a reference") // a dead node's
    .commit();
  const backend = await store.backend("doctor");
  const found: DamageFinding[] = [];
  for await (const f of backend.findDamage()) found.push(f);
  assert.deepEqual(found.map((f) => [f.kind, f.entry, f.heldBy ?? null]), [
    ["master-undecodable", '["idalloc", "test", "id", 7]', ["a"]],
    ["counter-wrong-type", '["idalloc", "test", "touch", "held"]', ["a"]],
    ["reference-undecodable", '["idalloc", "test", "ref", "other", "a"]', ["a"]],
    ["reference-undecodable", '["idalloc", "test", "ref", "other", "gone"]', null],
  ]);
  // Held ones are refused, naming their holder (the master by its token; the others are also
  // judged again at the removal); the dead node's goes.
  for (const f of found.slice(0, 3)) {
    await assert.rejects(
      backend.removeDamage(f),
      (e) => e instanceof LiveEntryError && e.holders.join() === "a",
    );
  }
  assert.equal(await backend.removeDamage(found[3]), true);
  assert.equal(await value(store, [...P, "ref", "other", "a"]), "not a reference");
  assert.equal(await value(store, [...P, "touch", "held"]), "x");
  // Once the node is gone, nothing holds them: a new listing removes them.
  await store.fixture.dropLease("a");
  for await (const f of backend.findDamage()) {
    assert.equal(f.heldBy, undefined);
    assert.equal(await backend.removeDamage(f), true, f.entry);
  }
  // A reference of a node that came back after the listing is refused at the removal.
  await store.kv.set([...P, "ref", "other", "b"], "not a reference");
  const late = (await Array.fromAsync(backend.findDamage())).find((f) => f.node === "b")!;
  assert.equal(late.heldBy, undefined);
  await store.session("b");
  await assert.rejects(backend.removeDamage(late), LiveEntryError);
  // release --node's admin path: a live node's reference is refused, a dead node's deleted.
  const admin = backend.admin();
  await assert.rejects(admin.deleteReference("other", "b", never), LiveEntryError);
  await store.kv.set([...P, "ref", "k", "gone"], { id: 3, lease: "l" });
  assert.equal(await admin.deleteReference("k", "gone", never), true);
});
