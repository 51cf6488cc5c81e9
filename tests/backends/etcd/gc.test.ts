/**
 * GC support: versions that change when a node acquires, liveness by exact references naming the
 * ID, and a delete guarded at its commit point (including the "/" range trap).
 */
import assert from "node:assert/strict";
import type { BackendSession, GcCandidate } from "../../../src/allocator/backend.ts";
import { b } from "../../../src/backends/etcd/testing/fixture.ts";
import {
  deadline,
  etcdTest,
  oneNode,
  picker,
  requestsDuring,
  twoNodes,
  withLease,
} from "./_helpers.ts";

async function list(s: BackendSession, min = 1, max = 1_000_000): Promise<GcCandidate[]> {
  const out: GcCandidate[] = [];
  for await (const c of s.gcList({ min, max }, deadline())) out.push(c);
  return out;
}

etcdTest(
  "gcList: range filter, liveness, and a version that moves when a node acquires",
  async () => {
    await using setup = await twoNodes();
    const { sa, sc, signal } = setup;
    await sa.acquire({ key: "used;", pickCandidate: picker(10), signal });
    await sa.acquire({ key: "idle;", pickCandidate: picker(11), signal });
    await sa.acquire({ key: "far;", pickCandidate: picker(500), signal });
    await sa.release("idle;", 11, signal);

    const first = await list(sa, 1, 100);
    assert.deepEqual(first.map((x) => [x.id, x.key, x.inUse]), [[10, "used;", true], [
      11,
      "idle;",
      false,
    ]]);
    // Another node joins "used;": its version changes although the master did not.
    await sc.acquire({ key: "used;", pickCandidate: picker(12), signal });
    const second = await list(sa, 1, 100);
    assert.notEqual(second[0].version, first[0].version);
    assert.equal(second[1].version, first[1].version, "an untouched idle master keeps its version");
  },
);

etcdTest("gcDelete: deletes an unchanged idle master in one transaction", async () => {
  await using setup = await oneNode();
  const { ns, a, sa, signal } = setup;
  await sa.acquire({ key: "idle;", pickCandidate: picker(11), signal });
  await sa.release("idle;", 11, signal);
  const [cand] = await list(sa);
  const { result, requests } = await requestsDuring(
    a,
    () => sa.gcDelete(cand, signal),
    "gc delete",
  );
  assert.deepEqual([result, requests], [true, 1]);
  assert.equal(await ns.raw.get(ns.layout.masterKey(11)).string(), null);
  assert.equal(await sa.gcDelete(cand, signal), false, "already gone");
});

etcdTest("gcDelete never deletes an ID a node referenced after the listing", async () => {
  await using setup = await twoNodes();
  const { ns, sa, sc, signal } = setup;
  const r = await sa.acquire({ key: "K;", pickCandidate: picker(11), signal });
  await sa.release("K;", 11, signal);
  const [cand] = await list(sa);
  assert.equal(cand.inUse, false);
  // Between GC's judgement and its delete, a node (with the ID in its cache) takes a reference.
  await sc.acquire({
    key: "K;",
    hint: { id: 11, version: r.version! },
    pickCandidate: picker(12),
    signal,
  });
  assert.equal(await sa.gcDelete(cand, signal), false);
  assert.equal(await ns.raw.get(ns.layout.masterKey(11)).string(), "K;");
  // A master deleted and re-created since the listing is not deleted either.
  await sc.release("K;", 11, signal);
  await ns.raw.delete().key(ns.layout.masterKey(11));
  await ns.raw.put(ns.layout.masterKey(11)).value("K;");
  assert.equal(await sa.gcDelete(cand, signal), false, "mod revision changed");
});

etcdTest("gcDelete with the '/' trap: other keys' references do not keep 'a;' alive", async () => {
  await using setup = await oneNode();
  const { ns, sa, signal } = setup;
  await sa.acquire({ key: "a;/b;", pickCandidate: picker(20), signal });
  await sa.acquire({ key: "a;", pickCandidate: picker(21), signal });
  await sa.release("a;", 21, signal);
  const cands = await list(sa);
  assert.deepEqual(cands.map((x) => [x.key, x.inUse]), [["a;/b;", true], ["a;", false]]);
  const short = cands.find((x) => x.key === "a;")!;
  // a;/b;'s reference names 20, not 21: one transaction.
  assert.equal(await sa.gcDelete(short, signal), true);
  assert.equal(
    await ns.raw.get(ns.layout.masterKey(20)).string(),
    "a;/b;",
    "the other key untouched",
  );
});

etcdTest(
  "gcDelete when the hidden range holds the same ID: re-read, then guarded delete",
  async () => {
    await using setup = await oneNode();
    const { ns, a, sa, signal } = setup;
    await sa.acquire({ key: "a;", pickCandidate: picker(21), signal });
    await sa.release("a;", 21, signal);
    await withLease(ns.raw, 60, async (lease) => {
      // A reference of the key "a;/b;" that happens to say 21 (a broken or foreign writer).
      await ns.raw.kv.put({ key: b(ns.layout.refKey("a;/b;", "x")), value: b("21"), lease });
      const [cand] = (await list(sa)).filter((x) => x.key === "a;");
      assert.equal(cand.inUse, false, "only exact references count");
      const { result, requests } = await requestsDuring(
        a,
        () => sa.gcDelete(cand, signal),
        "gc delete",
      );
      assert.deepEqual([result, requests], [true, 2]);
    });
  },
);

etcdTest(
  "a stale duplicate master is collected while its key lives on under another ID",
  async () => {
    await using setup = await oneNode();
    const { ns, sa, signal } = setup;
    await ns.raw.put(ns.layout.masterKey(40)).value("K;"); // stale: no reference names 40
    await sa.acquire({ key: "K;", pickCandidate: picker(41), signal });
    const cands = await list(sa);
    assert.deepEqual(cands.map((x) => [x.id, x.inUse]), [[40, false], [41, true]]);
    assert.equal(await sa.gcDelete(cands[0], signal), true);
    assert.equal(await sa.gcDelete(cands[1], signal), false, "the live one stays");
    assert.equal(await sa.get("K;", signal), 41);
  },
);
