/**
 * Leases: shared by references (≤ 1000 keys each), kept alive, replaced at once when lost, and
 * Cilium's UpdateIfDifferent lease rule in `ensure`.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import { b } from "../../../src/backends/etcd/testing/fixture.ts";
import { MAX_KEYS_PER_LEASE } from "../../../src/backends/etcd/limits.ts";
import { leaseTtlSeconds } from "../../../src/backends/etcd/session.ts";
import {
  deadline,
  etcdTest,
  eventually,
  namespace,
  oneNode,
  picker,
  twoNodes,
  withLease,
} from "./_helpers.ts";

Deno.test("lease TTL: ms rounded up to whole seconds, at least 2 s", () => {
  assert.equal(leaseTtlSeconds(500), 2);
  assert.equal(leaseTtlSeconds(2000), 2);
  assert.equal(leaseTtlSeconds(2001), 3);
  assert.equal(leaseTtlSeconds(900_000), 900);
});

etcdTest("references share one lease, which outlives several TTLs while kept alive", async () => {
  await using setup = await oneNode({ leaseTtlMs: 2_000 });
  const { ns, sa, signal } = setup;
  for (let i = 0; i < 20; i++) {
    await sa.acquire({ key: `k${i};`, pickCandidate: picker(i + 1), signal });
  }
  const leases = new Set(
    (await ns.dump()).filter((kv) => kv.key.includes("/value/")).map((kv) => kv.lease),
  );
  assert.equal(leases.size, 1);
  assert.equal(sa.status().leases, 1);
  // Two TTLs later the keepalives have kept every reference.
  const lease = [...leases][0];
  const ttl = await ns.raw.leaseClient.leaseTimeToLive({ ID: lease });
  assert.equal(Number(ttl.grantedTTL), 2);
  await new Promise((r) => setTimeout(r, 4_200));
  const refs = (await ns.dump()).filter((kv) => kv.key.includes("/value/"));
  assert.equal(refs.length, 20);
  assert.ok(refs.every((kv) => kv.lease === lease));
});

etcdTest(`at most ${MAX_KEYS_PER_LEASE} references per lease`, async () => {
  await using setup = await oneNode({ leaseTtlMs: 30_000 });
  const { ns, sa } = setup;
  const held = Array.from(
    { length: MAX_KEYS_PER_LEASE + 5 },
    (_, i) => ({ key: `k${i};`, id: i + 1 }),
  );
  // ensure re-creates missing masters and references in batches: the quickest way to 1005 refs.
  const reports = await sa.ensure(held, deadline(30_000));
  assert.ok(reports.every((r) => r.master === "recreated" && r.reference === "recreated"));
  const perLease = new Map<string, number>();
  for (const kv of await ns.dump()) {
    if (kv.key.includes("/value/")) perLease.set(kv.lease, (perLease.get(kv.lease) ?? 0) + 1);
  }
  assert.deepEqual([...perLease.values()].sort((x, y) => x - y), [5, MAX_KEYS_PER_LEASE]);
  assert.equal(sa.status().leases, 2);
});

etcdTest(
  "a revoked lease is replaced at once; ensure puts the references back on the new one",
  async () => {
    let replaced = 0;
    await using setup = await oneNode({ leaseTtlMs: 2_000, onLeaseReplaced: () => replaced++ });
    const { ns, sa, signal } = setup;
    const held = [];
    for (let i = 0; i < 5; i++) {
      const r = await sa.acquire({ key: `k${i};`, pickCandidate: picker(i + 1), signal });
      held.push({ key: `k${i};`, id: r.id });
    }
    const old = (await ns.dump()).find((kv) => kv.key.includes("/value/"))!.lease;
    await ns.raw.leaseClient.leaseRevoke({ ID: old });
    // etcd deleted the references with the lease; the next keepalive reports it gone.
    await eventually(() => replaced === 1, "onLeaseReplaced was called");
    assert.equal((await ns.dump()).filter((kv) => kv.key.includes("/value/")).length, 0);
    const reports = await sa.ensure(held, signal);
    assert.ok(reports.every((r) => r.master === "ok" && r.reference === "recreated"));
    const refs = (await ns.dump()).filter((kv) => kv.key.includes("/value/"));
    assert.equal(refs.length, 5);
    assert.ok(refs.every((kv) => kv.lease !== old && kv.lease !== "0"));
    assert.equal(sa.status().leases, 1);
    assert.match(sa.status().lastError ?? "", /lost/);
  },
);

etcdTest(
  "a write refused with 'lease not found' takes a new lease and still succeeds",
  async () => {
    let replaced = 0;
    // A long TTL: the keepalive (every 10 s) will not notice before the write does.
    await using setup = await oneNode({ leaseTtlMs: 30_000, onLeaseReplaced: () => replaced++ });
    const { ns, sa, signal } = setup;
    await sa.acquire({ key: "k0;", pickCandidate: picker(1), signal });
    const old = (await ns.dump()).find((kv) => kv.key.includes("/value/"))!.lease;
    await ns.raw.leaseClient.leaseRevoke({ ID: old });
    const r = await sa.acquire({ key: "k1;", pickCandidate: picker(2), signal });
    assert.equal(r.id, 2);
    assert.equal(replaced, 1, "replacement reported synchronously with the failed write");
    const ref = (await ns.dump()).find((kv) => kv.key.endsWith("/value/k1;/a"))!;
    assert.notEqual(ref.lease, old);
  },
);

etcdTest("ensure moves a surviving reference off a lease that is not the session's", async () => {
  await using setup = await oneNode();
  const { ns, sa, signal } = setup;
  await sa.acquire({ key: "K;", pickCandidate: picker(3), signal });
  await withLease(ns.raw, 60, async (foreign) => {
    // Same value, wrong lease (e.g. left over from a lease this node has replaced).
    await ns.raw.kv.put({ key: b(ns.layout.refKey("K;", "a")), value: b("3"), lease: foreign });
    const [report] = await sa.ensure([{ key: "K;", id: 3 }], signal);
    assert.deepEqual(report, { key: "K;", id: 3, master: "ok", reference: "recreated" });
    const ref = (await ns.dump()).find((kv) => kv.key.endsWith("/value/K;/a"))!;
    assert.notEqual(ref.lease, foreign);
    const [again] = await sa.ensure([{ key: "K;", id: 3 }], signal);
    assert.deepEqual(again, { key: "K;", id: 3, master: "ok", reference: "ok" });
  });
});

etcdTest("ensure: missing master re-created, conflicts left alone and reported", async () => {
  await using setup = await twoNodes();
  const { ns, sa, sc, signal } = setup;
  await sa.acquire({ key: "A;", pickCandidate: picker(1), signal });
  await sa.acquire({ key: "B;", pickCandidate: picker(2), signal });
  await ns.raw.delete().key(ns.layout.masterKey(1));
  // B's master now belongs to another key; C's references name another ID.
  await ns.raw.put(ns.layout.masterKey(2)).value("other;");
  await sc.acquire({ key: "C;", pickCandidate: picker(9), signal });
  const reports = await sa.ensure([
    { key: "A;", id: 1 },
    { key: "B;", id: 2 },
    { key: "C;", id: 3 },
  ], signal);
  assert.deepEqual(reports, [
    { key: "A;", id: 1, master: "recreated", reference: "ok" },
    { key: "B;", id: 2, master: "conflict", reference: "skipped" },
    { key: "C;", id: 3, master: "conflict", reference: "skipped" },
  ]);
  assert.equal(await ns.raw.get(ns.layout.masterKey(1)).string(), "A;");
  assert.equal(await ns.raw.get(ns.layout.masterKey(2)).string(), "other;");
  assert.equal(await ns.raw.get(ns.layout.masterKey(3)).string(), null);
});

etcdTest(
  "allocator: a lost lease's references come back at once, not at the next sync",
  async () => {
    await using ns = await namespace();
    const a = await ns.backend("a");
    await using alloc = await Allocator.open(a, {
      min: 1,
      max: 1000,
      leaseTtlMs: 2_000,
      syncIntervalMs: 3_600_000,
    });
    const ids = new Map<string, number>();
    for (let i = 0; i < 10; i++) ids.set(`k${i};`, (await alloc.allocate(`k${i};`)).id);
    const refsNow = async () => (await ns.dump()).filter((kv) => kv.key.includes("/value/"));
    const old = (await refsNow())[0].lease;
    await ns.raw.leaseClient.leaseRevoke({ ID: old });
    await eventually(async () => {
      const refs = await refsNow();
      return refs.length === 10 && refs.every((kv) => kv.lease !== old);
    }, "every reference is back on a new lease");
    for (const kv of await refsNow()) {
      const key = ns.layout.splitRefKey(kv.key)!.key;
      assert.equal(Number(kv.value), ids.get(key));
    }
  },
);
