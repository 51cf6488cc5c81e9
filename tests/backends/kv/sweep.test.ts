/**
 * The GC pass's sweep of dead node state: dead references of keys in use and expired lease records
 * without references. A real KV file; clocks injected where expiry matters; races forced at the
 * commit point with the commit-interposing proxy.
 */
import assert from "node:assert/strict";
import { GarbageCollector, RateLimiter } from "../../../src/allocator/gc.ts";
import type { DenoKvSession } from "../../../src/backends/kv/session.ts";
import { Clock, gcPass, KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;

function collector(s: DenoKvSession): GarbageCollector {
  return new GarbageCollector(s, { min: 1, max: 1_000 }, new RateLimiter(1_000, 1_000));
}

/** `[key, node]` of every reference, and the nodes of every lease record. */
async function state(store: TestStore): Promise<{ refs: string[][]; leases: string[] }> {
  const dump = await store.dump();
  return {
    refs: dump.filter((e) => e.key[0] === "ref").map((e) => e.key.slice(1) as string[]),
    leases: dump.filter((e) => e.key[0] === "lease").map((e) => e.key[1] as string),
  };
}

Deno.test("kv sweep: a key in use loses dead nodes' references and keeps its ID", async () => {
  await using store = await TestStore.create();
  const clock = new Clock();
  const a = await store.session("a", { now: clock.now });
  const r = await a.acquire(request("k1", { first: 1 }));
  // "old": a node whose lease expired (it stopped renewing).
  const old = await store.session("old", { now: clock.now, leaseTtlMs: 1_000 });
  await old.acquire(request("k1", { hint: { id: 1, version: r.version! } }));
  await old.close();
  // "gone": no lease record at all. "moved": a live record with another lease id.
  await store.kv.atomic()
    .set([...P, "ref", "k1", "gone"], { id: 1, lease: "x" })
    .set([...P, "ref", "k1", "moved"], { id: 1, lease: "before" })
    .set([...P, "lease", "moved"], { lease: "after", expiresAt: clock.ms + 60_000 })
    .commit();
  clock.advance(2_000);
  const gc = collector(a);
  const stats = await gc.run(never);
  assert.deepEqual({ deleted: stats.deleted, ids: stats.deletedIds }, { deleted: 0, ids: [] });
  assert.deepEqual(await state(store), {
    refs: [["k1", "a"]],
    // "old" has no references left and expired: its record goes too. "moved" is alive.
    leases: ["a", "moved"],
  });
  assert.deepEqual(await store.fixture.masters(), new Map([[1, "k1"]]));
  assert.equal((await gc.run(never)).deleted, 0);
  assert.deepEqual((await gcPass(a)).map((c) => [c.id, c.inUse]), [[1, true]]);
});

Deno.test("kv sweep: dead references beyond one commit's checks are swept in batches", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a");
  await a.acquire(request("k1", { first: 1 }));
  for (let i = 0; i < 120; i += 40) {
    const op = store.kv.atomic();
    for (let j = i; j < i + 40; j++) {
      op.set([...P, "ref", "k1", `ghost-${j}`], { id: 1, lease: "x" });
    }
    await op.commit();
  }
  const before = a.stats.commits;
  await gcPass(a);
  // Two checks per reference of a distinct node: 50 per commit.
  assert.equal(a.stats.commits - before, 3);
  assert.deepEqual((await state(store)).refs, [["k1", "a"]]);
});

Deno.test("kv sweep: only expired lease records without references left are deleted", async () => {
  await using store = await TestStore.create();
  const clock = new Clock();
  const a = await store.session("a", { now: clock.now });
  await a.acquire(request("k2", { first: 2 }));
  await a.release("k2", 2, never);
  await store.kv.atomic()
    .set([...P, "lease", "idle-dead"], { lease: "x", expiresAt: clock.ms - 1_000 })
    // Expired, but within the skew margin (50 ms): still live for a node whose clock lags.
    .set([...P, "lease", "recent"], { lease: "y", expiresAt: clock.ms - 10 })
    .set([...P, "lease", "corrupt"], 42)
    // Expired, with a dead reference to an unused key that is not collected yet.
    .set([...P, "lease", "held"], { lease: "z", expiresAt: clock.ms - 1_000 })
    .set([...P, "ref", "k2", "held"], { id: 2, lease: "z" })
    .commit();
  const all = ["a", "corrupt", "held", "idle-dead", "recent"];
  // A read-only session lists without writing anything.
  const ro = await store.session("ro", { now: clock.now, readOnly: true });
  await gcPass(ro);
  assert.deepEqual((await state(store)).leases, all);

  const gc = collector(a);
  assert.equal((await gc.run(never)).deleted, 0); // marks k2
  assert.deepEqual((await state(store)).leases, ["a", "corrupt", "held", "recent"]);
  assert.deepEqual((await gc.run(never)).deletedIds, [2]); // collects k2 and held's reference
  // The pass saw held's reference, so its record waits for the next pass.
  assert.deepEqual(await state(store), { refs: [], leases: ["a", "corrupt", "held", "recent"] });
  await gc.run(never);
  assert.deepEqual((await state(store)).leases, ["a", "corrupt", "recent"]);
});

Deno.test("kv sweep: a node renewing between GC's read and commit keeps record and references", async () => {
  await using store = await TestStore.create();
  const nodeClock = new Clock();
  // GC's clock runs far beyond the skew bound, so it judges the renewing nodes expired: only the
  // versionstamp guards stand between them and the sweep.
  const gcClock = new Clock(nodeClock.ms);
  const { session: gc, hook } = await store.hookedSession("gc", {
    now: gcClock.now,
    maxClockSkewMs: 50,
    leaseTtlMs: 10_000_000,
  });
  const a = await store.session("a", { now: nodeClock.now });
  const idle = await store.session("idle", { now: nodeClock.now });
  const r = await gc.acquire(request("k1", { first: 1 }));
  await a.acquire(request("k1", { hint: { id: 1, version: r.version! } }));
  gcClock.advance(120_000);
  let renewals = 0;
  // First GC commit: a's reference to k1 (in use through gc's own). Second: idle's record.
  hook.before = async () => {
    await a.lease!.renewNow();
    renewals++;
    hook.before = async () => {
      await idle.lease!.renewNow();
      renewals++;
    };
  };
  const [c] = await gcPass(gc);
  assert.equal(c.inUse, true);
  assert.equal(renewals, 2);
  assert.deepEqual([a.lease!.replacements, idle.lease!.replacements], [0, 0]);
  const ref = await store.kv.get([...P, "ref", "k1", "a"]);
  assert.deepEqual(ref.value, { id: 1, lease: a.lease!.id });
  const [la, li] = await store.kv.getMany<{ lease: string }[]>([
    [...P, "lease", "a"],
    [...P, "lease", "idle"],
  ]);
  assert.deepEqual([la.value?.lease, li.value?.lease], [a.lease!.id, idle.lease!.id]);
  // Their next renewals find their own last versionstamps: nothing was replaced.
  await a.lease!.renewNow();
  await idle.lease!.renewNow();
  assert.deepEqual([a.lease!.replacements, idle.lease!.replacements], [0, 0]);
});

Deno.test("kv sweep: a reference re-acquired between GC's read and commit is kept", async () => {
  await using store = await TestStore.create();
  const { session: gc, hook } = await store.hookedSession("gc");
  const x = await store.session("x");
  const r = await gc.acquire(request("k1", { first: 1 }));
  // x's record is live, but its reference names an older lease: dead.
  await store.kv.set([...P, "ref", "k1", "x"], { id: 1, lease: "stale" });
  let fired = false;
  // x re-acquires without touching its lease record: only the reference's own check catches it.
  hook.before = async () => {
    await x.acquire(request("k1", { hint: { id: 1, version: r.version! } }));
    fired = true;
  };
  await gcPass(gc);
  assert.equal(fired, true);
  const live = async () =>
    (await store.fixture.references()).map((ref) => [ref.key, ref.node, ref.live]);
  assert.deepEqual(await live(), [["k1", "gc", true], ["k1", "x", true]]);
  await gcPass(gc);
  assert.deepEqual(await live(), [["k1", "gc", true], ["k1", "x", true]]);
});
