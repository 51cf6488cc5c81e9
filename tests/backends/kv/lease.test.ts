import assert from "node:assert/strict";
import { InvalidOptionsError } from "../../../src/errors.ts";
import {
  Clock,
  gcPass,
  held,
  KV_FIXTURE_PREFIX,
  never,
  request,
  type SessionSetup,
  TestStore,
} from "./_helpers.ts";

const P = KV_FIXTURE_PREFIX;
const TTL = 10_000;
const SKEW = 1_000;

async function leaseRecord(store: TestStore, node: string) {
  return await store.kv.get<{ lease: string; expiresAt: number }>([...P, "lease", node]);
}

/** Session options on `clock`, with this file's lease TTL and clock skew. */
function onClock(clock: Clock): SessionSetup {
  return { now: clock.now, maxClockSkewMs: SKEW, leaseTtlMs: TTL };
}

/** Node "a" on a fresh clock (see {@linkcode onClock}), counting its lease replacements. */
async function clockedNode(store: TestStore) {
  const clock = new Clock();
  const counter = { replaced: 0 };
  const a = await store.session("a", {
    ...onClock(clock),
    onLeaseReplaced: () => counter.replaced++,
  });
  return { clock, a, counter };
}

Deno.test("kv lease: renewal keeps the lease id and moves expiresAt", async () => {
  await using store = await TestStore.create();
  const { clock, a, counter } = await clockedNode(store);
  const first = (await leaseRecord(store, "a")).value!;
  assert.equal(first.expiresAt, clock.ms + TTL);
  clock.advance(TTL / 3);
  await a.lease!.renewNow();
  const second = (await leaseRecord(store, "a")).value!;
  assert.equal(second.lease, first.lease);
  assert.equal(second.expiresAt, clock.ms + TTL);
  assert.equal(counter.replaced, 0);
});

Deno.test("kv lease: a lease too close to expiry is replaced, never renewed", async () => {
  await using store = await TestStore.create();
  const { clock, a, counter } = await clockedNode(store);
  const first = (await leaseRecord(store, "a")).value!;
  await a.acquire(request("k1", { first: 1 }));
  clock.advance(TTL - SKEW); // within the skew margin of expiresAt
  await a.lease!.renewNow();
  const second = (await leaseRecord(store, "a")).value!;
  assert.notEqual(second.lease, first.lease);
  assert.equal(counter.replaced, 1);
  assert.equal(a.lease!.replacements, 1);
  // The old reference is now dead; ensure re-writes it under the new lease.
  assert.deepEqual((await store.fixture.references()).map((r) => r.live), [false]);
  const [report] = await a.ensure([held("k1", 1)], never);
  assert.deepEqual(report, { key: "k1", id: 1, master: "ok", reference: "recreated" });
  const ref = await store.kv.get<{ id: number; lease: string }>([...P, "ref", "k1", "a"]);
  assert.equal(ref.value!.lease, second.lease);
});

Deno.test("kv lease: a deleted or overwritten lease record is replaced", async () => {
  await using store = await TestStore.create();
  let replaced = 0;
  const a = await store.session("a", { leaseTtlMs: TTL, onLeaseReplaced: () => replaced++ });
  const first = (await leaseRecord(store, "a")).value!;
  await store.kv.delete([...P, "lease", "a"]);
  await a.lease!.renewNow();
  const second = (await leaseRecord(store, "a")).value!;
  assert.notEqual(second.lease, first.lease);
  assert.equal(replaced, 1);
  await store.kv.set([...P, "lease", "a"], { lease: "someone-else", expiresAt: 0 });
  await a.lease!.renewNow();
  assert.equal(replaced, 2);
  assert.notEqual((await leaseRecord(store, "a")).value!.lease, "someone-else");
});

Deno.test("kv lease: acquire under an expired lease replaces it first", async () => {
  await using store = await TestStore.create();
  const { clock, a, counter } = await clockedNode(store);
  clock.advance(TTL * 2); // as if the process had been suspended: no renewal ran
  await a.acquire(request("k1"));
  assert.equal(counter.replaced, 1);
  const lease = (await leaseRecord(store, "a")).value!;
  assert.equal(lease.expiresAt, clock.ms + TTL);
  // Judged on the same clock, the new reference is live.
  const b = await store.session("b", onClock(clock));
  const [c] = await gcPass(b, 0);
  assert.equal(c.inUse, true);
});

Deno.test("kv lease: an expired but still present lease record makes its references dead; GC collects", async () => {
  await using store = await TestStore.create();
  const clock = new Clock();
  // Node a dies: its session is closed (no renewal), its lease record stays in the store.
  const a = await store.session("a", onClock(clock));
  await a.acquire(request("dead-key", { first: 1 }));
  await a.close();
  const gc = await store.session("gc", onClock(clock));
  const live = await gc.acquire(request("live-key", { first: 2 }));

  // gc keeps renewing in time; a's expiresAt is reached but still within the skew margin.
  for (let i = 0; i < 4; i++) {
    clock.advance(TTL / 4);
    await gc.lease!.renewNow();
  }
  assert.equal(gc.lease!.replacements, 0);
  assert.deepEqual((await gcPass(gc, 0)).map((c) => [c.id, c.inUse]), [[1, true], [2, true]]);

  clock.advance(SKEW + 1);
  await gc.lease!.renewNow();
  assert.notEqual((await leaseRecord(store, "a")).versionstamp, null, "record still present");
  const pass1 = await gcPass(gc, 0);
  assert.deepEqual(pass1.map((c) => [c.id, c.inUse]), [[1, false], [2, true]]);
  const pass2 = await gcPass(gc, 0);
  assert.deepEqual(pass2[0], pass1[0], "unchanged between the two passes");
  assert.equal(await gc.gcDelete(pass2[0], never), true);

  assert.deepEqual(await store.fixture.masters(), new Map([[2, "live-key"]]));
  const dump = await store.dump();
  assert.ok(!dump.some((e) => e.key[1] === "dead-key"), "index, touch and dead ref are gone");
  assert.equal(live.id, 2);
});

Deno.test("kv lease: a lease TTL below twice the clock skew is refused", async () => {
  await using store = await TestStore.create();
  const backend = await store.backend("a", { maxClockSkewMs: 1_000 });
  await assert.rejects(
    backend.openSession({ leaseTtlMs: 1_500, readOnly: false, onLeaseReplaced: () => {} }),
    InvalidOptionsError,
  );
});

Deno.test("kv lease: the renewal timer runs every ttl/3 and stops on close", async () => {
  await using store = await TestStore.create();
  const a = await store.session("a", { leaseTtlMs: 600, maxClockSkewMs: 20 });
  const first = await leaseRecord(store, "a");
  // Wait (without asserting on time) until a renewal has happened.
  while ((await leaseRecord(store, "a")).versionstamp === first.versionstamp) {
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal((await leaseRecord(store, "a")).value!.lease, first.value!.lease);
  assert.ok(a.backgroundStats.commits >= 2);
  await a.close();
});
