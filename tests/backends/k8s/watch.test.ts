// The informer's index on plain data: key → identities follows every change of an identity's key,
// Cilium's answer is the oldest, and resource versions compare as numbers. On a real API server:
// the first list comes from the watch cache; an expired watch re-lists (consistently) and reports
// what vanished, once.
import assert from "node:assert/strict";
import { rawClient } from "../../../src/backends/etcd/testing/fixture.ts";
import { startKubeApiServer } from "../../../src/backends/k8s/testing/cluster.ts";
import { collect, deadline, eventually, fixture, k8sTest } from "./_helpers.ts";
import { IdentityIndex } from "../../../src/backends/k8s/watch.ts";
import { OwnWrites } from "../../../src/backends/k8s/own_writes.ts";
import type { IdentityRecord } from "../../../src/backends/k8s/layout.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import { countedClient, type KubeClient } from "../../../src/backends/k8s/kube.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";

const rec = (id: number, key: string, created: number, rv = "1"): IdentityRecord => ({
  id,
  key,
  rv,
  created,
  refs: new Map(),
  annotated: false,
});

Deno.test("the index keeps key → identities and answers the oldest", () => {
  const index = new IdentityIndex();
  index.set(rec(7, "k", 2000));
  index.set(rec(5, "k", 3000));
  index.set(rec(9, "j", 1000));
  assert.equal(index.answer("k")?.id, 7);
  assert.deepEqual(index.ofKey("k").map((r) => r.id).sort(), [5, 7]);
  // 7 now carries another key (deleted and re-created): it leaves k's list.
  index.set(rec(7, "j", 4000, "2"));
  assert.equal(index.answer("k")?.id, 5);
  assert.equal(index.answer("j")?.id, 9);
  index.delete(5);
  assert.equal(index.answer("k"), undefined);
  assert.equal(index.size, 2);
});

Deno.test("the index: a key's identities added, re-set and removed in any order", () => {
  const index = new IdentityIndex();
  const ids = (key: string) => index.ofKey(key).map((r) => r.id).sort();
  index.set(rec(1, "k", 3000));
  index.set(rec(1, "k", 3000, "2"));
  assert.deepEqual(ids("k"), [1], "a new version of one identity");
  index.set(rec(2, "k", 2000));
  index.set(rec(3, "k", 1000));
  index.set(rec(2, "k", 2000, "2"));
  assert.deepEqual(ids("k"), [1, 2, 3]);
  index.delete(3);
  index.delete(1);
  assert.deepEqual(ids("k"), [2]);
  index.set(rec(4, "k", 500));
  assert.equal(index.answer("k")?.id, 4);
  index.delete(2);
  index.delete(4);
  index.delete(4);
  assert.deepEqual(ids("k"), []);
  assert.equal(index.size, 0);
});

Deno.test("own writes: versions are placed by the watch's order, compared only for equality", () => {
  let now = 0;
  const own = new OwnWrites(1_000, () => now);
  // Versions that do not sort as numbers: nothing here may order them.
  assert.equal(own.delivered(7, "b"), true, "no write of this session: the watch's event applies");
  assert.equal(own.wrote(7, "b", "b"), false, "the index holds that version already");
  assert.equal(own.wrote(7, "q", "b"), true, "this session's patch, answered at q");
  assert.equal(own.holds(7), true);
  assert.equal(own.delivered(7, "z"), false, "an event before the write in the stream: held back");
  assert.equal(own.delivered(7, undefined), false, "a delete before a re-creation: held back");
  assert.equal(own.delivered(8, "a"), true, "other identities are not held back");
  assert.equal(own.delivered(7, "q"), true, "the write's echo: in step again");
  assert.equal(own.delivered(7, "c"), true);
  assert.equal(own.wrote(7, "q", "c"), false, "a late answer the watch overtook is stale");

  // A write the watch never delivers holds its identity back only until it expires.
  assert.equal(own.wrote(9, "m", undefined), true);
  now = 999;
  assert.equal(own.delivered(9, "n"), false);
  now = 1_001;
  assert.equal(own.delivered(9, "o"), true);
  assert.equal(own.holds(9), false);
});

Deno.test("own writes: a re-list decides writes answered before it, not those during it", () => {
  const own = new OwnWrites();
  own.wrote(1, "x", undefined);
  const mark = own.listing();
  own.wrote(2, "y", undefined);
  assert.deepEqual(own.listed(mark), [2], "written while the list was under way");
  assert.equal(own.holds(1), false, "the consistent list reflects a write answered before it");
  assert.equal(own.delivered(2, "w"), false, "the list's version of 2 cannot be placed");
  own.settled(2);
  assert.equal(own.delivered(2, "w"), true);
});

// On a real API server of its own (the test restarts it).

k8sTest(
  "a watch that expires (410 after an API-server restart) re-lists: what vanished meanwhile is deleted once, nothing repeated",
  async () => {
    await using cluster = await startKubeApiServer({ ciliumCrds: false });
    await using fx = await fixture(cluster);
    const writer = await fx.session("w");
    const reader = await (await fx.backend("r")).openSession({
      leaseTtlMs: 3_000,
      readOnly: true,
      onLeaseReplaced: () => {},
    });
    const { events, stop } = collect((signal) => reader.watch(signal));
    for (const [key, id] of [["a;", 300], ["b;", 301]] as const) {
      await writer.acquire({ key, pickCandidate: () => id, signal: deadline() });
    }
    await eventually(
      () => events.filter((e) => e.type === "upsert").length === 2,
      "the reader saw both identities",
    );
    await cluster.kill();
    // While no API server runs, 301 vanishes from etcd behind everyone's back.
    const raw = rawClient(cluster.etcd.endpoints);
    try {
      const key = `/registry/${fx.group}/ciliumidentities/301`;
      assert.ok(await raw.get(key).string(), "the identity is stored where expected");
      await raw.delete().key(key);
    } finally {
      raw.close();
    }
    await cluster.restart();
    await writer.acquire({ key: "c;", pickCandidate: () => 302, signal: deadline() });
    await eventually(
      () =>
        events.some((e) => e.type === "delete" && e.id === 301) &&
        events.some((e) => e.type === "upsert" && e.id === 302),
      "the reader re-listed: 301 deleted, 302 seen",
    );
    await stop();
    const changes = events.filter((e) => e.type !== "synced")
      .map((e) => e.type === "upsert" ? `upsert ${e.id}@${e.version}` : `${e.type} ${e.id}`);
    assert.deepEqual(changes.filter((c) => c.startsWith("delete")), ["delete 301"]);
    assert.equal(new Set(changes).size, changes.length, `nothing repeated: ${changes}`);
    assert.deepEqual(events.filter((e) => e.type === "synced").length, 1);
  },
);

k8sTest(
  "the first list comes from the watch cache in one response (as client-go's reflector's), and the index holds it",
  async () => {
    await using fx = await fixture();
    for (const id of [300, 301]) await fx.createIdentity(id, { "idalloc:key": `k${id}` });
    const lists: unknown[] = [];
    const client = {
      ...countedClient(fx.client, { count: 0 }),
      list: ((res, o) => {
        if (res.plural === "ciliumidentities") lists.push(o?.resourceVersion ?? "");
        return fx.client.list(res, o);
      }) as KubeClient["list"],
    };
    await using backend = await K8sBackend.connect(fx.options("r"), { client });
    const reader = await backend.openSession({
      leaseTtlMs: 3_000,
      readOnly: true,
      onLeaseReplaced: () => {},
    }) as K8sSession;
    await reader.informer.waitSynced(deadline());
    assert.deepEqual([...reader.informer.index.records()].map((r) => r.id).sort(), [300, 301]);
    // The connect probe lists with limit 1; the informer's list is the watch cache's.
    assert.deepEqual(lists.at(-1), "0");
  },
);
