/**
 * The lock-free acquisition protocol on a real etcd: round trips, races, the "/" range trap,
 * stale masters, corrupt and conflicting states, key checks.
 */
import assert from "node:assert/strict";
import {
  ConflictError,
  InvalidKeyError,
  PoolExhaustedError,
  ReadOnlyError,
  SplitKeyError,
} from "../../../src/errors.ts";
import { MAX_KEY_BYTES } from "../../../src/backends/etcd/mod.ts";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { CuttingProxy } from "../../_support/cutting_proxy.ts";
import { b } from "../../../src/backends/etcd/testing/fixture.ts";
import {
  deadline,
  etcdTest,
  namespace,
  oneNode,
  openSession,
  picker,
  requestsDuring,
  storeView,
  twoNodes,
  withLease,
} from "./_helpers.ts";

etcdTest("new key: one transaction; existing key with a hint: one; without: two", async () => {
  await using setup = await twoNodes();
  const { ns, a, c, sa, sc, signal } = setup;

  const created = await requestsDuring(
    a,
    () => sa.acquire({ key: "k;", pickCandidate: picker(7), signal }),
  );
  assert.deepEqual([created.result.id, created.result.created, created.requests], [7, true, 1]);

  const hinted = await requestsDuring(c, () =>
    sc.acquire({
      key: "k;",
      hint: { id: 7, version: created.result.version! },
      pickCandidate: picker(8),
      signal,
    }));
  assert.deepEqual([hinted.result.id, hinted.result.created, hinted.requests], [7, false, 1]);

  // Again (own reference present, other node's too): still one.
  const again = await requestsDuring(
    a,
    () =>
      sa.acquire({ key: "k;", hint: { id: 7, version: "x" }, pickCandidate: picker(8), signal }),
  );
  assert.deepEqual([again.result.id, again.requests], [7, 1]);

  // Cache lag (no hint): the create attempt fails and returns the state; the second joins.
  const d = await ns.backend("d");
  await using sd = await openSession(d);
  const lagging = await requestsDuring(
    d,
    () => sd.acquire({ key: "k;", pickCandidate: picker(9), signal }),
  );
  assert.deepEqual([lagging.result.id, lagging.result.created, lagging.requests], [7, false, 2]);
  assert.equal((await ns.dump()).filter((kv) => kv.key.includes("/id/")).length, 1, "no ID burnt");
});

etcdTest("an existing key with no references is re-joined in one transaction", async () => {
  await using setup = await oneNode();
  const { a, sa, signal } = setup;
  const first = await sa.acquire({ key: "k;", pickCandidate: picker(5), signal });
  await sa.release("k;", 5, signal);
  // The range is empty now: the ladder's "no reference" step applies.
  const again = await requestsDuring(
    a,
    () =>
      sa.acquire({
        key: "k;",
        hint: { id: 5, version: first.version! },
        pickCandidate: picker(6),
        signal,
      }),
  );
  assert.deepEqual([again.result.id, again.result.created, again.requests], [5, false, 1]);
});

etcdTest(
  "racing nodes on one new key: one ID, each finishes in at most two transactions",
  async () => {
    await using ns = await namespace();
    const nodes = await Promise.all(["n1", "n2", "n3", "n4", "n5", "n6"].map((n) => ns.backend(n)));
    const sessions = await Promise.all(nodes.map((n) => openSession(n)));
    try {
      for (let round = 0; round < 5; round++) {
        const key = `race-${round};`;
        const signal = deadline();
        // Different candidates per node: the worst case (identical candidates collide on the master).
        const results = await Promise.all(
          sessions.map((s, i) =>
            requestsDuring(
              nodes[i],
              () =>
                s.acquire({ key, pickCandidate: picker(100 * (round + 1) + i, 1000 + i), signal }),
            )
          ),
        );
        const ids = new Set(results.map((r) => r.result.id));
        assert.equal(ids.size, 1, `one ID for ${key}: ${[...ids]}`);
        assert.equal(results.filter((r) => r.result.created).length, 1, "exactly one creator");
        for (const r of results) assert.ok(r.requests <= 2, `took ${r.requests} transactions`);
        const masters = (await ns.dump()).filter((kv) =>
          kv.key.startsWith(`${ns.layout.masterRange}`)
        );
        assert.equal(masters.filter((kv) => kv.value === key).length, 1, "one master for the key");
      }
    } finally {
      await Promise.all(sessions.map((s) => s.close()));
    }
  },
);

etcdTest(
  "the '/' trap: references of 'a;/b;' neither false-match 'a;' nor livelock it",
  async () => {
    await using setup = await twoNodes();
    const { ns, a, c, sa, sc, signal } = setup;

    const long = await sa.acquire({ key: "a;/b;", pickCandidate: picker(20), signal });
    assert.equal(long.id, 20);
    assert.equal(await sa.get("a;", signal), undefined, "no false match on 'a;'");

    // New 'a;' while the range value/a;/ holds a;/b;'s reference: second transaction succeeds.
    const short = await requestsDuring(
      a,
      () => sa.acquire({ key: "a;", pickCandidate: picker(20, 21), signal }),
    );
    assert.deepEqual([short.result.id, short.result.created, short.requests], [21, true, 2]);
    assert.equal(await sa.get("a;", signal), 21);
    assert.equal(await sa.get("a;/b;", signal), 20);

    // Joining 'a;' with a hint: the ladder's value and emptiness steps fail on a;/b;'s reference;
    // a re-read plus the "unchanged since" step finishes it.
    const hinted = await requestsDuring(c, () =>
      sc.acquire({
        key: "a;",
        hint: { id: 21, version: short.result.version! },
        pickCandidate: picker(22),
        signal,
      }));
    assert.deepEqual([hinted.result.id, hinted.requests], [21, 2]);
    // And without a hint from a node that never saw it.
    const d = await ns.backend("d");
    await using sd = await openSession(d);
    const cold = await sd.acquire({ key: "a;", pickCandidate: picker(20, 21, 22), signal });
    assert.deepEqual([cold.id, cold.created], [21, false]);
    // The long key's references are untouched and still its own.
    const refs = (await ns.dump()).filter((kv) => kv.key.includes("/value/"));
    assert.deepEqual(refs.map((kv) => [kv.key.slice(ns.prefix.length), kv.value]), [
      ["/value/a;/a", "21"],
      ["/value/a;/b;/a", "20"],
      ["/value/a;/c", "21"],
      ["/value/a;/d", "21"],
    ]);
  },
);

etcdTest("the '/' trap in the other order, and a range kept busy by the other key", async () => {
  await using setup = await oneNode();
  const { ns, sa, signal } = setup;
  const short = await sa.acquire({ key: "a;", pickCandidate: picker(30), signal });
  const long = await sa.acquire({ key: "a;/b;", pickCandidate: picker(30, 31), signal });
  assert.deepEqual([short.id, long.id], [30, 31]);
  // Many nodes join 'a;/b;' while others join 'a;' (whose range holds a;/b;'s references):
  // every call ends, with the right IDs.
  const nodes = await Promise.all(Array.from({ length: 6 }, (_, i) => ns.backend(`x${i}`)));
  const sessions = await Promise.all(nodes.map((n) => openSession(n)));
  try {
    const results = await Promise.all(sessions.flatMap((s) => [
      s.acquire({ key: "a;/b;", pickCandidate: picker(32), signal }),
      s.acquire({ key: "a;", pickCandidate: picker(33), signal }).catch((e) => e),
    ]));
    for (const [i, r] of results.entries()) {
      if (r instanceof ConflictError) continue; // retryable: the allocator retries with backoff
      assert.ok(!(r instanceof Error), String(r));
      assert.equal(r.id, i % 2 === 0 ? 31 : 30);
    }
    assert.ok(results.filter((r) => !(r instanceof Error)).length >= 6, "most succeed at once");
  } finally {
    await Promise.all(sessions.map((s) => s.close()));
  }
});

etcdTest("a stale cache hint never gives a key a second live ID", async () => {
  await using setup = await twoNodes();
  const { ns, sa, sc, signal } = setup;
  // K had ID 40, every node released it: master id/40 = K with no reference.
  const old = await sa.acquire({ key: "K;", pickCandidate: picker(40), signal });
  await sa.release("K;", 40, signal);
  // A node with an empty cache creates a new master for K (allowed: 40 has no live reference).
  const fresh = await sc.acquire({ key: "K;", pickCandidate: picker(41), signal });
  assert.deepEqual([fresh.id, fresh.created], [41, true]);
  // A node whose cache still says K → 40 must end up on 41.
  const stale = await sa.acquire({
    key: "K;",
    hint: { id: 40, version: old.version! },
    pickCandidate: picker(42),
    signal,
  });
  assert.equal(stale.id, 41);
  const refs = (await ns.dump()).filter((kv) => kv.key.includes("/value/"));
  assert.deepEqual(new Set(refs.map((kv) => kv.value)), new Set(["41"]));
});

etcdTest(
  "an unreferenced master of the key is reused when the create attempt finds it",
  async () => {
    await using setup = await oneNode();
    const { ns, sa, signal } = setup;
    await ns.raw.put(ns.layout.masterKey(50)).value("K;");
    // The candidate is that very master (same key → same first candidate on every node).
    const r = await sa.acquire({ key: "K;", pickCandidate: picker(50, 51), signal });
    assert.deepEqual([r.id, r.created], [50, false]);
    // A master of another key is skipped for the next candidate.
    await ns.raw.put(ns.layout.masterKey(60)).value("other;");
    const s = await sa.acquire({ key: "L;", pickCandidate: picker(60, 61), signal });
    assert.deepEqual([s.id, s.created], [61, true]);
    assert.equal(await ns.raw.get(ns.layout.masterKey(60)).string(), "other;", "never rewritten");
  },
);

etcdTest(
  "references whose master vanished: the master is re-created, not a second ID",
  async () => {
    await using setup = await twoNodes();
    const { ns, sa, sc, signal } = setup;
    await sa.acquire({ key: "K;", pickCandidate: picker(70), signal });
    await ns.raw.delete().key(ns.layout.masterKey(70));
    const r = await sc.acquire({ key: "K;", pickCandidate: picker(71), signal });
    assert.deepEqual([r.id, r.created], [70, true]);
    assert.equal(await ns.raw.get(ns.layout.masterKey(70)).string(), "K;");
    assert.equal(await ns.raw.get(ns.layout.masterKey(71)).string(), null);
  },
);

etcdTest(
  "pool exhaustion: typed error, but only after the store says the key is not live",
  async () => {
    await using setup = await twoNodes();
    const { ns, sa, sc, signal } = setup;
    await sa.acquire({ key: "K;", pickCandidate: picker(80), signal });
    // c's pool is empty, but K is live: joining it needs no new ID.
    const joined = await sc.acquire({ key: "K;", pickCandidate: () => undefined, signal });
    assert.equal(joined.id, 80);
    await assert.rejects(
      sc.acquire({ key: "new;", pickCandidate: () => undefined, signal }),
      (e) => e instanceof PoolExhaustedError && e.retryable,
    );
    assert.equal((await ns.dump()).filter((kv) => kv.key.includes("new;")).length, 0);
  },
);

etcdTest("references that disagree (a split) are refused at once with SplitKeyError", async () => {
  await using ns = await namespace();
  await withLease(ns.raw, 60, async (lease) => {
    await ns.raw.kv.put({ key: b(ns.layout.refKey("K;", "x")), value: b("1"), lease });
    await ns.raw.kv.put({ key: b(ns.layout.refKey("K;", "y")), value: b("2"), lease });
    const a = await ns.backend("a");
    await using sa = await openSession(a);
    await assert.rejects(
      sa.acquire({ key: "K;", pickCandidate: picker(3), signal: deadline() }),
      (e) =>
        e instanceof SplitKeyError && !e.retryable && e.key === "K;" &&
        e.ids.join() === "1,2" && /\(1, 2\)/.test(e.message),
    );
    assert.equal(
      (await ns.dump()).filter((kv) => kv.key.endsWith("/a")).length,
      0,
      "nothing added",
    );
  });
});

etcdTest(
  "checkKey: empty, NUL, lone surrogates, oversize, escaping keys; the largest key works",
  async () => {
    await using ns = await namespace();
    const a = await ns.backend("a");
    const bad = [
      "",
      "a\0b",
      "\ud800",
      "x".repeat(MAX_KEY_BYTES + 1),
      "../id/5",
      "..",
      "a/../..",
      ".",
    ];
    for (const key of bad) {
      assert.throws(() => a.checkKey(key), InvalidKeyError, JSON.stringify(key.slice(0, 20)));
    }
    for (const key of ["a;", "a//b;", "k8s:x=a/../b;", "é✓;", "x".repeat(MAX_KEY_BYTES)]) {
      a.checkKey(key);
    }
    // The largest key through the largest transaction: a join without a hint (create attempt,
    // then the full agreement ladder).
    const big = "k".repeat(MAX_KEY_BYTES - 1) + ";";
    const c = await ns.backend("c");
    await using sa = await openSession(a);
    await using sc = await openSession(c);
    const signal = deadline();
    const first = await sa.acquire({ key: big, pickCandidate: picker(90), signal });
    const second = await sc.acquire({ key: big, pickCandidate: picker(91), signal });
    assert.deepEqual([first.id, second.id], [90, 90]);
    assert.equal(await sc.getById(90, signal), big);
    const ensured = await sc.ensure([{ key: big, id: 90 }], signal);
    assert.equal(ensured[0].reference, "ok");
  },
);

etcdTest(
  "release deletes only this node's reference; read-only sessions write nothing",
  async () => {
    await using setup = await twoNodes();
    const { ns, sa, sc, signal } = setup;
    await sa.acquire({ key: "K;", pickCandidate: picker(5), signal });
    await sc.acquire({ key: "K;", pickCandidate: picker(5), signal });
    await sa.release("K;", 5, signal);
    const refs = (await ns.dump()).filter((kv) => kv.key.includes("/value/"));
    assert.deepEqual(refs.map((kv) => kv.key.slice(ns.prefix.length)), ["/value/K;/c"]);
    assert.equal(await ns.raw.get(ns.layout.masterKey(5)).string(), "K;", "master stays for GC");

    const r = await ns.backend("reader");
    await using ro = await openSession(r, { readOnly: true });
    assert.equal(ro.status().leases, 0);
    await assert.rejects(
      ro.acquire({ key: "Z;", pickCandidate: picker(9), signal }),
      ReadOnlyError,
    );
    await assert.rejects(async () => await ro.release("K;", 5, signal), ReadOnlyError);
    assert.equal(await ro.get("K;", signal), 5);
  },
);

etcdTest("an aborted signal rejects with its own reason, before or during the call", async () => {
  await using setup = await oneNode();
  const { sa } = setup;
  const pre = new AbortController();
  pre.abort(new DOMException("gone", "AbortError"));
  await assert.rejects(
    sa.acquire({ key: "K;", pickCandidate: picker(1), signal: pre.signal }),
    (e) => e === pre.signal.reason,
  );
  const during = new AbortController();
  const p = sa.acquire({
    key: "K;",
    pickCandidate: (ex) => {
      during.abort(new DOMException("late", "TimeoutError"));
      return picker(1)(ex);
    },
    signal: during.signal,
  });
  await assert.rejects(p, (e) => e === during.signal.reason);
});

etcdTest("a create whose answer was lost with its connection is reported new once", async () => {
  await using ns = await namespace();
  const etcd = new URL(ns.endpoints[0]);
  await using proxy = new CuttingProxy({ hostname: etcd.hostname, port: Number(etcd.port) });
  const backend = await ns.backend("a", { endpoints: [proxy.endpoint] });
  await using a = await Allocator.open(backend, { max: 1000 });
  await a.waitForInitialSync();
  // The first request naming the key is the create; etcd applies it, its answer never comes.
  const cut = proxy.arm("app=lost;");
  const { result: first, requests } = await requestsDuring(backend, () => a.allocate("app=lost;"));
  await cut;
  assert.ok(requests >= 2, `the create was sent again after the cut (${requests} sends)`);
  assert.deepEqual(first, { id: first.id, isNew: true, firstUse: true });
  assert.deepEqual((await storeView(ns)).masters, new Map([[first.id, "app=lost;"]]));

  // Nobody else reports it new.
  await using c = await Allocator.open(await ns.backend("c"), { max: 1000 });
  assert.deepEqual(await c.allocate("app=lost;"), { id: first.id, isNew: false, firstUse: true });
});
