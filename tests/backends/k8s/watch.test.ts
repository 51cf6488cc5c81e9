// The informer's index on plain data: key → identities follows every change of an identity's key,
// Cilium's answer is the oldest, and resource versions compare as numbers. On a real API server:
// the first list comes from the watch cache; an expired watch re-lists (consistently) and reports
// what vanished, once.
import assert from "node:assert/strict";
import { rawClient } from "../../../src/backends/etcd/testing/fixture.ts";
import { startKubeApiServer } from "../../../src/backends/k8s/testing/cluster.ts";
import { collect, deadline, eventually, fixture, k8sTest } from "./_helpers.ts";
import { IdentityIndex, newer } from "../../../src/backends/k8s/watch.ts";
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

Deno.test("resource versions compare as numbers when they are", () => {
  assert.equal(newer("10", "9"), true);
  assert.equal(newer("9", "10"), false);
  assert.equal(newer("9", "9"), false);
  assert.equal(newer("a", "b"), true, "opaque versions: any other version is taken as newer");
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
