// The Kubernetes session on a real kube-apiserver: acquire, release, get, getById and watch round
// trips with the round trips each operation costs; ensure's repairs; Cilium's GC mark removed from
// a held identity; a pre-existing duplicate answered as Cilium answers it (the oldest), and a held
// key moved to an older identity of it; NodeInUseError and `restart`; a lost Lease re-proven; a
// lapsed lease fenced, its identity collected and its key re-proven under another ID.
import assert from "node:assert/strict";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { StoreUnavailableError } from "../../../src/errors.ts";
import { countedClient, type KubeClient, type Tally } from "../../../src/backends/k8s/kube.ts";
import { nodeLeaseName, readNodeLease } from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import { MAX_KEY_BYTES } from "../../../src/backends/k8s/limits.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";
import { collect, deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

const picker = (...ids: number[]) => (exclude: ReadonlySet<number>) =>
  ids.find((id) => !exclude.has(id));

/** A session whose every API call is counted in the returned tally. */
async function countedSession(
  fx: Awaited<ReturnType<typeof fixture>>,
  node: string,
): Promise<{ session: K8sSession; tally: Tally; close: () => Promise<void> }> {
  const tally = { count: 0 };
  const backend = await K8sBackend.connect(fx.options(node), {
    client: countedClient(fx.client, tally),
  });
  // A long lease: no renewal falls inside the counted calls.
  const session = await backend.openSession({
    leaseTtlMs: 60_000,
    readOnly: false,
    onLeaseReplaced: () => {},
  }) as K8sSession;
  await session.informer.waitSynced(deadline());
  return { session, tally, close: () => backend.close() };
}

/** The round trips `fn` makes on `tally`. */
async function trips<T>(tally: Tally, fn: () => Promise<T>): Promise<[T, number]> {
  const before = tally.count;
  const value = await fn();
  return [value, tally.count - before];
}

k8sTest(
  "round trips: new key 2 (3 requests), join 1, ensure of a healthy key 0, release 1; get, getById, watch",
  async () => {
    await using fx = await fixture();
    const a = await countedSession(fx, "a");
    const b = await countedSession(fx, "b");
    try {
      const key = "app=web;";
      const newKey = { count: 0 };
      const created = await a.session.acquire({
        key,
        pickCandidate: picker(300, 301),
        signal: deadline(),
        roundTrips: newKey,
      });
      // The claim and the reference in parallel, then the create: two round trips.
      assert.deepEqual([created.id, created.created, newKey.count], [300, true, 3]);

      // b joins through its index once the watch has shown it the identity: one write, of its
      // own reference object (the identity is not written).
      await eventually(() => b.session.informer.index.answer(key) !== undefined, "b sees 300");
      const join = { count: 0 };
      const joined = await b.session.acquire({
        key,
        pickCandidate: picker(999),
        signal: deadline(),
        roundTrips: join,
      });
      assert.deepEqual([joined.id, joined.created, join.count], [300, false, 1]);

      const [reports, ensureTrips] = await trips(
        a.tally,
        () => a.session.ensure([{ key, id: 300 }], deadline()),
      );
      assert.deepEqual(reports, [{ key, id: 300, master: "ok", reference: "ok" }]);
      assert.equal(ensureTrips, 0, "a healthy key: checked in the informer, nothing sent");

      const [id, getTrips] = await trips(b.tally, () => b.session.get(key, deadline()));
      assert.deepEqual([id, getTrips], [300, 2], "claim and identity, read in parallel");
      const [stored, byIdTrips] = await trips(b.tally, () => b.session.getById(300, deadline()));
      assert.deepEqual([stored, byIdTrips], [key, 1]);
      assert.equal(await b.session.getById(301, deadline()), undefined);
      assert.equal(await b.session.get("app=none;", deadline()), undefined);

      const [, releaseTrips] = await trips(b.tally, () => b.session.release(key, 300, deadline()));
      assert.equal(releaseTrips, 1);
      assert.deepEqual([...await fx.held("b")], [], "b's reference went");
      assert.deepEqual([...await fx.held("a")], [[300, a.session.lease!.epoch]], "a's stays");
      assert.deepEqual(
        Object.keys((await fx.identity(300))!.metadata.annotations!).sort(),
        ["idalloc.io/creator", "idalloc.io/lease-namespace"],
        "the identity carries no reference: its creator and the coordination namespace",
      );

      // A watch: the identity as an upsert, synced, then a live change.
      const { events, stop } = collect((signal) => a.session.watch(signal));
      await eventually(() => events.some((e) => e.type === "synced"), "the watch synced");
      assert.deepEqual(events[0], {
        type: "upsert",
        id: 300,
        key,
        version: events[0].type === "upsert" ? events[0].version : "",
      });
      await a.session.acquire({
        key: "k8s:app=db;",
        pickCandidate: picker(400),
        signal: deadline(),
      });
      await eventually(
        () => events.some((e) => e.type === "upsert" && e.id === 400 && e.key === "k8s:app=db;"),
        "the watch shows the new identity",
      );
      await stop();
      // Cilium's layout: the k8s: labels as metadata.labels.
      assert.deepEqual((await fx.identity(400))!.metadata.labels, { app: "db" });
    } finally {
      await a.close();
      await b.close();
    }
  },
);

k8sTest(
  "ensure re-creates a deleted identity (same ID) and reports a taken one; a reference removed by hand comes back once GC marks the identity",
  async () => {
    await using fx = await fixture();
    const s = await fx.session("a");
    const key = "k8s:app=api;";
    const { id } = await s.acquire({ key, pickCandidate: picker(500), signal: deadline() });

    // Removed by hand: ensure does not poll for it; GC, not seeing it, marks the identity, and
    // the node answers the mark by unmarking and writing its whole reference object again.
    await fx.dropHeld("a", id);
    // One pass, no grace: it marks what it finds unused (a second would delete it).
    const gc = await fx.allocator("gc", { gcGraceMs: 0 });
    await gc.runGc();
    await eventually(async () => (await fx.held("a")).get(id) === s.lease!.epoch, "re-written");
    await eventually(
      async () =>
        (await fx.identity(id))!.metadata.annotations?.["io.cilium.heartbeat"] === undefined,
      "unmarked",
    );

    await fx.client.delete(fx.identities, String(id), { signal: deadline() });
    await eventually(() => s.informer.index.get(id) === undefined, "the informer saw the delete");
    assert.deepEqual(await s.ensure([{ key, id }], deadline()), [
      { key, id, master: "recreated", reference: "recreated" },
    ]);
    const back = await fx.identity(id);
    assert.deepEqual(back!["security-labels"], { "k8s:app": "api" });
    assert.equal((await fx.held("a")).get(id), s.lease!.epoch);

    await fx.client.delete(fx.identities, String(id), { signal: deadline() });
    await fx.createIdentity(id, { "k8s:app": "intruder" });
    await eventually(() => s.informer.index.get(id)?.key === "k8s:app=intruder;", "seen");
    assert.deepEqual(await s.ensure([{ key, id }], deadline()), [
      { key, id, master: "conflict", reference: "skipped" },
    ]);
  },
);

k8sTest(
  "a held identity marked with io.cilium.heartbeat is unmarked at once; an unheld one stays marked",
  async () => {
    await using fx = await fixture();
    const s = await fx.session("a");
    const held = await s.acquire({ key: "held;", pickCandidate: picker(600), signal: deadline() });
    const free = await s.acquire({ key: "free;", pickCandidate: picker(601), signal: deadline() });
    await s.release("free;", free.id, deadline());
    const mark = { metadata: { annotations: { "io.cilium.heartbeat": new Date().toISOString() } } };
    await fx.patchIdentity(free.id, mark);
    const marked = await fx.patchIdentity(held.id, mark);
    await eventually(
      async () =>
        (await fx.identity(held.id))!.metadata.annotations?.["io.cilium.heartbeat"] === undefined,
      "the held identity lost its mark",
    );
    await eventually(() => s.unmarked === 1, "the session counted the unmark");
    // The informer saw both marks, in order, before the unmark's own event.
    await eventually(
      () => BigInt(s.informer.index.get(held.id)!.rv) > BigInt(marked.metadata.resourceVersion!),
      "the informer saw the unmark",
    );
    assert.ok((await fx.identity(free.id))!.metadata.annotations?.["io.cilium.heartbeat"]);
  },
);

k8sTest("a pre-existing duplicate: both idalloc nodes answer the oldest identity", async () => {
  await using fx = await fixture();
  const key = "k8s:app=dup;";
  const first = await fx.createIdentity(500, { "k8s:app": "dup" });
  // creationTimestamp has one-second resolution: the second identity comes a second later.
  const second0 = Math.floor(Date.now() / 1000);
  await eventually(() => Math.floor(Date.now() / 1000) > second0, "the next second");
  const second = await fx.createIdentity(400, { "k8s:app": "dup" });
  assert.ok(
    Date.parse(second.metadata.creationTimestamp!) > Date.parse(first.metadata.creationTimestamp!),
  );
  const a = await fx.allocator("a");
  const b = await fx.allocator("b");
  assert.deepEqual(await a.allocate(key), { id: 500, isNew: false, firstUse: true });
  assert.deepEqual(await b.allocate(key), { id: 500, isNew: false, firstUse: true });
  assert.equal(await b.getNoCache(key), 500);
  assert.equal((await fx.records()).length, 2, "idalloc added no third identity");
});

k8sTest(
  "a held key whose older identity appears moves to it (ensure: conflict → reassigned)",
  async () => {
    await using fx = await fixture();
    const older = await fx.createIdentity(700, { "idalloc:key": "other;" });
    const second0 = Math.floor(Date.now() / 1000);
    await eventually(() => Math.floor(Date.now() / 1000) > second0, "the next second");
    const a = await fx.allocator("a");
    const key = "moving;";
    const { id } = await a.allocate(key);
    assert.notEqual(id, 700);
    const { events, stop } = collect((signal) => a.watch({ signal }));
    // Identity 700, created before the key's own, now carries the key: Cilium's answer is 700.
    await fx.patchIdentity(700, { "security-labels": { "idalloc:key": key } });
    assert.ok(older.metadata.creationTimestamp);
    await eventually(
      () => events.some((e) => e.type === "reassigned" && e.oldId === id && e.newId === 700),
      "a announces the move to 700",
    );
    assert.equal(await a.get(key), 700);
    await stop();
  },
);

k8sTest(
  "NodeInUseError for a live node name; restart takes the Lease and the old session loses it",
  async () => {
    await using fx = await fixture();
    const first = await fx.session("a");
    await assert.rejects(() => fx.session("a"), { name: "NodeInUseError" });
    const second = await fx.session("a", {}, { restart: true });
    assert.notEqual(second.lease!.epoch, first.lease!.epoch);
    await first.renew(deadline());
    assert.match(first.status().lastError ?? "", /lease lost/);
    // Mid-session the loss heals by itself (a new epoch once the other Lease lapses): retryable.
    await assert.rejects(
      () => first.acquire({ key: "x", pickCandidate: picker(300), signal: deadline() }),
      (err: Error & { retryable?: boolean }) =>
        err.name === "ConflictError" && err.retryable === true &&
        (err.cause as Error).name === "NodeInUseError",
    );
  },
);

k8sTest(
  "a session that holds nothing frees its node name when it closes; one holding a reference leaves its Lease to lapse",
  async () => {
    await using fx = await fixture();
    const leaseOf = (node: string) =>
      fx.client.get(LEASES, nodeLeaseName(node), { namespace: fx.namespace, signal: deadline() });
    const a = await fx.session("a");
    const { id } = await a.acquire({ key: "x", pickCandidate: picker(300), signal: deadline() });
    await a.release("x", id, deadline());
    await a.close();
    assert.equal(await leaseOf("a"), undefined, "deleted with the session");
    const again = await fx.session("a");
    await again.acquire({ key: "x", pickCandidate: picker(300), signal: deadline() });
    await again.close();
    assert.ok(await leaseOf("a"), "its reference lives until the Lease lapses");
    await assert.rejects(() => fx.session("a"), { name: "NodeInUseError" });
  },
);

k8sTest(
  "a node whose Lease vanished takes a new epoch, fences, and re-proves its references",
  async () => {
    await using fx = await fixture();
    const replaced: number[] = [];
    const a = await fx.allocator("a");
    const key = "k8s:app=fenced;";
    const { id } = await a.allocate(key);
    const before = readNodeLease(
      (await fx.client.get(LEASES, nodeLeaseName("a"), {
        namespace: fx.namespace,
        signal: deadline(),
      }))!,
    )!;
    assert.equal((await fx.held("a")).get(id), before.epoch);
    await fx.client.delete(LEASES, nodeLeaseName("a"), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    await eventually(async () => {
      const lease = await fx.client.get(LEASES, nodeLeaseName("a"), {
        namespace: fx.namespace,
        signal: deadline(),
      });
      const epoch = lease === undefined ? undefined : readNodeLease(lease)?.epoch;
      if (epoch === undefined || epoch === before.epoch) return false;
      replaced.push(1);
      return (await fx.held("a")).get(id) === epoch;
    }, "a new epoch, and the reference re-written under it");
    assert.equal(await a.get(key), id);
    assert.deepEqual((await a.allocate(key)).id, id);
  },
);

k8sTest(
  "lease lapse: the node fences, GC collects its identity, and the node re-proves its key elsewhere",
  async () => {
    await using fx = await fixture();
    // A partition between node a and its Lease: its renewals fail while `blocked`.
    let blocked = false;
    const partitioned: KubeClient = {
      ...countedClient(fx.client, { count: 0 }), // the real client's calls, as own methods
      patch: (res, name, body, o) =>
        blocked && res.plural === "leases"
          ? Promise.reject(new StoreUnavailableError("partitioned (test)"))
          : fx.client.patch(res, name, body, o),
      create: (res, obj, o) =>
        blocked && res.plural === "leases"
          ? Promise.reject(new StoreUnavailableError("partitioned (test)"))
          : fx.client.create(res, obj, o),
    };
    const backend = await K8sBackend.connect(fx.options("a"), { client: partitioned });
    try {
      await using a = await Allocator.open(backend, { max: 65535, leaseTtlMs: 3_000 });
      const key = "k8s:app=lapsed;";
      const { id } = await a.allocate(key);
      const { events, stop } = collect((signal) => a.watch({ signal }));
      blocked = true;
      await eventually(() => a.status().fence.active && a.status().fence.lapses > 0, "a fenced");
      // A lease TTL of grace (the default elsewhere; this store's own is Cilium's 30 min).
      const gc = await fx.allocator("gc", { gcGraceMs: 3_000 });
      await eventually(async () => (await gc.runGc()).deletedIds.includes(id), "GC collected it");
      // The ID goes to another key (as a Cilium node would take it).
      await fx.createIdentity(id, { "k8s:app": "taker" });
      blocked = false;
      await eventually(
        () => events.some((e) => e.type === "reassigned" && e.key === key && e.oldId === id),
        "a re-proved its key under another ID",
      );
      const moved = events.find((e) => e.type === "reassigned")!;
      assert.ok(moved.type === "reassigned" && moved.newId !== id);
      assert.equal(await a.get(key), moved.newId);
      assert.equal(a.status().fence.active, false);
      await stop();
    } finally {
      await backend.close();
    }
  },
);

k8sTest(
  "the largest key checkKey accepts is stored (identity and claim), one byte more is refused",
  async () => {
    await using fx = await fixture();
    const backend = await fx.backend("a");
    const key = "x".repeat(MAX_KEY_BYTES);
    backend.checkKey(key);
    assert.throws(() => backend.checkKey(key + "x"), { name: "InvalidKeyError" });
    const s = await fx.session("b");
    const { id, created } = await s.acquire({ key, pickCandidate: () => 300, signal: deadline() });
    assert.deepEqual([id, created], [300, true]);
    assert.equal(await s.getById(300, deadline()), key);
    assert.equal(await s.get(key, deadline()), 300);
  },
);

k8sTest(
  "a key whose identity the API server's validation refuses is an InvalidKeyError, never a raw 422",
  async () => {
    await using fx = await fixture();
    const a = await fx.session("a");
    // An empty label value: v1.20 API servers with an older JSON decoder refuse it, newer accept.
    try {
      await a.acquire({ key: "k8s:a=;k8s:b=c;", pickCandidate: picker(300), signal: deadline() });
    } catch (err) {
      assert.equal((err as Error).name, "InvalidKeyError", String(err));
      assert.equal((err as { retryable?: boolean }).retryable, false);
    }
  },
);

k8sTest(
  "a join on an index not provably current reads the identity and removes a GC mark the index lacks",
  async () => {
    await using fx = await fixture();
    const a = await fx.session("a");
    const b = await fx.session("b");
    const key = "k8s:app=stale;";
    const { id } = await a.acquire({ key, pickCandidate: picker(700), signal: deadline() });
    await a.release(key, id, deadline());
    await eventually(() => b.informer.index.get(id) !== undefined, "b's index has it");
    const unmarked = b.informer.index.get(id)!;
    // GC marks it; b's watch then breaks before it shows the mark (as after API-server and etcd
    // restarts): its index still shows the identity unmarked, and it knows its view is not current.
    await fx.client.patch(fx.identities, String(id), {
      metadata: { annotations: { "io.cilium.heartbeat": new Date().toISOString() } },
    }, { type: "merge", signal: deadline() });
    await eventually(() => b.informer.index.get(id)?.mark !== undefined, "b saw the mark");
    b.informer.index.set(unmarked);
    b.informer.freshness.lost();
    const joined = await b.acquire({ key, pickCandidate: picker(701), signal: deadline() });
    assert.equal(joined.id, id);
    const stored = (await fx.identity(id))!;
    assert.equal(
      stored.metadata.annotations?.["io.cilium.heartbeat"],
      undefined,
      "the join read the identity and removed the mark before answering",
    );
  },
);
