// GC's judgement on plain data (`users.ts`): an identity is in use while a reference on it is
// live (its node's Lease live and carrying its epoch), a CiliumEndpoint or a CiliumEndpointSlice
// names it, or it was created or marked less than the grace ago (by default on this store Cilium's
// heartbeat timeout, 30 min); the candidate carries the resource version and the time of a GC
// mark, whoever wrote it. On the real API server: GC marks with Cilium's annotation and deletes
// guarded by the version, never what a live node references or an endpoint or slice names, nor
// what was created or marked within the heartbeat timeout (a short one here); an acquire between
// mark and delete saves the identity; a lapsed node's identities are collected.
import assert from "node:assert/strict";
import { resolveOptions } from "../../../src/allocator/options.ts";
import { candidateOf } from "../../../src/backends/k8s/gc.ts";
import { claimName, nodeLeaseName, readIdentity } from "../../../src/backends/k8s/layout.ts";
import { CILIUM_HEARTBEAT_TIMEOUT_MS } from "../../../src/backends/k8s/limits.ts";
import { sweepPatch } from "../../../src/backends/k8s/patch.ts";
import { LEASES, resolveK8sOptions } from "../../../src/backends/k8s/options.ts";
import { endpointUsers, inUse, recentUntil, usedBy } from "../../../src/backends/k8s/users.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

const SKEW = 1_000;
const settings = { maxClockSkewMs: SKEW, graceMs: 60_000 };
const leases = new Map([
  ["live", { name: "idalloc-node-live", node: "live", epoch: "e1", expiresAt: 50_000, rv: "1" }],
  ["dead", { name: "idalloc-node-dead", node: "dead", epoch: "e1", expiresAt: 5_000, rv: "1" }],
]);

Deno.test("in use: a live reference of the Lease's epoch, an endpoint or slice naming the ID, a creation or mark within the grace", () => {
  const now = 10_000_000;
  const use = (users = new Map<number, string[]>()) => ({ leases, users, now, settings });
  const at = { ...use(), now: 10_000 };
  const rec = (refs: [string, string][], created = 0) => ({
    id: 300,
    refs: new Map(refs),
    created,
  });
  assert.equal(inUse(rec([["live", "e1"]]), at), true);
  assert.equal(inUse(rec([["live", "e0"]]), { ...at, now: 100_000 }), false, "old epoch");
  assert.equal(inUse(rec([["dead", "e1"]]), { ...at, now: 100_000 }), false, "lapsed");
  assert.equal(inUse(rec([["gone", "e1"]]), use()), false, "no Lease");
  assert.equal(inUse(rec([]), use(new Map([[300, ["CiliumEndpoint a/b"]]]))), true, "named");
  // Created less than the grace (plus the skew margin, and a second for the server's one-second
  // timestamps) ago: an agent may be about to name it.
  const old = now - settings.graceMs - SKEW - 1_000;
  assert.equal(inUse(rec([], old), use()), false);
  assert.equal(inUse(rec([], old + 1), use()), true, "created recently");
  // Marked less than the grace ago (by the mark's own time, as the allocator counts its grace).
  const marked = { ...rec([]), mark: new Date(now - 60_000 + 1).toISOString() };
  assert.equal(recentUntil(marked, settings), now + 1);
  assert.deepEqual(usedBy(marked, use()), [
    `new or marked recently (in use until ${new Date(now).toISOString().replace(".000", "")})`,
  ]);
  assert.equal(inUse({ ...marked, mark: new Date(now - 60_000).toISOString() }, use()), false);
  // A grace of 0 (an explicit `gcGraceMs: 0`) turns this part off.
  const none = { ...use(), settings: { maxClockSkewMs: SKEW, graceMs: 0 } };
  assert.equal(inUse({ ...marked, created: now }, none), false);
});

Deno.test("the store's default grace is Cilium operator's heartbeat timeout, 30 min unless given", () => {
  assert.equal(CILIUM_HEARTBEAT_TIMEOUT_MS, 30 * 60_000);
  assert.equal(resolveK8sOptions({ node: "n" }).heartbeatTimeoutMs, 30 * 60_000);
  assert.equal(
    resolveK8sOptions({ node: "n", heartbeatTimeoutMs: 4_000 }).heartbeatTimeoutMs,
    4_000,
  );
  // The allocator's grace defaults to the store's (never below the lease TTL); given, it wins.
  const store = { defaultGcGraceMs: CILIUM_HEARTBEAT_TIMEOUT_MS };
  assert.equal(resolveOptions({ max: 10 }, store).gcGraceMs, 30 * 60_000);
  assert.equal(resolveOptions({ max: 10, gcGraceMs: 0 }, store).gcGraceMs, 0);
  assert.equal(resolveOptions({ max: 10 }).gcGraceMs, 60_000, "elsewhere: the lease TTL");
});

Deno.test("endpoints name identities by status.identity.id, slices by endpoints[].id", () => {
  assert.deepEqual(
    endpointUsers(
      [
        { metadata: { name: "a", namespace: "ns" }, status: { identity: { id: 300 } } },
        { metadata: { name: "b", namespace: "ns" }, status: { identity: { id: "301" } } },
        { metadata: { name: "c", namespace: "ns" } },
      ],
      [
        { metadata: { name: "ces-1" }, endpoints: [{ id: 300 }, { id: 302 }, { id: 302 }] },
        { metadata: { name: "ces-2" }, endpoints: [{ name: "x" }, null, { id: -1 }] },
        { metadata: { name: "ces-3" } },
      ],
    ),
    new Map([
      [300, ["CiliumEndpoint ns/a", "CiliumEndpointSlice ces-1"]],
      [302, ["CiliumEndpointSlice ces-1"]],
    ]),
  );
});

Deno.test("a candidate carries the resource version and the mark's time", () => {
  const read = readIdentity({
    metadata: {
      name: "300",
      resourceVersion: "42",
      annotations: { "io.cilium.heartbeat": "2026-01-01T00:00:00.123456789Z" },
    },
    "security-labels": { "idalloc:key": "k" },
  });
  assert.ok(read.ok);
  assert.deepEqual(candidateOf(read.record, false), {
    id: 300,
    key: "k",
    version: "42",
    inUse: false,
    markedAt: Date.parse("2026-01-01T00:00:00.123Z"),
  });
  const unparseable = { ...read.record, mark: "soon" };
  assert.equal(candidateOf(unparseable, false).markedAt, undefined);
});

// On the real API server. GC allocators take the store's default grace, the heartbeat timeout (a
// short one here): what was created or marked within it stays.

/** A heartbeat timeout the fixture's 3 s leases allow (renewal within a third of it). */
const QUICK = { heartbeatTimeoutMs: 4_000 };

/** Until what was created (or marked) now is no longer within {@linkcode QUICK}'s grace. */
function pastHeartbeat(): Promise<void> {
  // The timeout, the server's one-second timestamps, the fixture's 500 ms skew margin, and slack.
  return new Promise((resolve) => setTimeout(resolve, QUICK.heartbeatTimeoutMs + 2_000));
}

const marked = (
  fx: {
    identity(
      id: number,
    ): Promise<{ metadata: { annotations?: Record<string, string> } } | undefined>;
  },
  id: number,
) => fx.identity(id).then((o) => o?.metadata.annotations?.["io.cilium.heartbeat"] !== undefined);

k8sTest(
  "GC marks, then deletes guarded by the version: never what a live node references, a CiliumEndpoint or a CiliumEndpointSlice names",
  async () => {
    await using fx = await fixture();
    const a = await fx.allocator("a", {}, QUICK);
    const b = await fx.allocator("b", {}, QUICK);
    const gc = await fx.allocator("gc", {}, QUICK);
    const held = await a.allocate("held;");
    const named = await b.allocate("named;");
    await b.release("named;");
    await fx.endpoint("pod-1", named.id);
    const sliced = await b.allocate("sliced;");
    await b.release("sliced;");
    await fx.endpointSlice("ces-1", [sliced.id]);
    const free = await b.allocate("free;");
    await b.release("free;");
    const ids = [held.id, named.id, sliced.id, free.id];

    await pastHeartbeat();
    const first = await gc.runGc();
    assert.deepEqual([first.deleted, first.marked], [0, 1]);
    assert.deepEqual(await Promise.all(ids.map((id) => marked(fx, id))), [
      false,
      false,
      false,
      true,
    ]);
    assert.deepEqual((await gc.runGc()).deletedIds, [], "marked less than the timeout ago");
    await pastHeartbeat();
    assert.deepEqual((await gc.runGc()).deletedIds, [free.id]);
    assert.deepEqual((await fx.records()).map((r) => r.id).sort(), ids.slice(0, 3).sort());
  },
);

k8sTest(
  "an identity a Cilium agent just made, with no endpoint yet: kept for Cilium's 30 min by default, collected a heartbeat timeout after its mark with a short one",
  async () => {
    await using fx = await fixture();
    // As a Cilium agent allocates: the identity first, its CiliumEndpoint later.
    await fx.createIdentity(300, { "k8s:app": "web" });
    const gc = await fx.allocator("gc"); // the store's default grace: Cilium's 30 min
    assert.equal(gc.backend.defaultGcGraceMs, 30 * 60_000);
    for (let pass = 0; pass < 2; pass++) {
      assert.deepEqual(await gc.runGc(), {
        alive: 1,
        deleted: 0,
        marked: 0,
        deletedIds: [],
        skipped: 0,
      });
    }
    assert.equal(await marked(fx, 300), false, "not even marked: it is in use");

    const quick = await fx.allocator("quick-gc", {}, QUICK);
    assert.equal((await quick.runGc()).marked, 0, "created less than the timeout ago");
    await pastHeartbeat();
    assert.equal((await quick.runGc()).marked, 1);
    assert.deepEqual((await quick.runGc()).deletedIds, [], "marked less than the timeout ago");
    await pastHeartbeat();
    assert.deepEqual((await quick.runGc()).deletedIds, [300]);
  },
);

k8sTest(
  "the key's claim goes with its identity once quiet; a claim written recently stays for a later pass's sweep",
  async () => {
    await using fx = await fixture();
    // Claims are quiet 2.5 s after their last write (half the heartbeat timeout, plus the skew).
    const a = await fx.allocator("a", {}, QUICK);
    const gc = await fx.allocator("gc", {}, QUICK);
    const claimOf = (key: string) =>
      fx.client.get(LEASES, claimName(`ciliumidentities.${fx.group}`, key), {
        namespace: fx.namespace,
        signal: deadline(),
      });
    const young = await a.allocate("young;");
    await a.release("young;");
    const old = await a.allocate("old;");
    await a.release("old;");
    await pastHeartbeat();
    assert.equal((await gc.runGc()).marked, 2);
    await pastHeartbeat();
    // A node re-creating young's identity from its claim would have written the claim just now.
    await fx.client.patch(LEASES, claimName(`ciliumidentities.${fx.group}`, "young;"), {
      spec: { renewTime: new Date().toISOString().replace("Z", "000Z") },
    }, { type: "merge", namespace: fx.namespace, signal: deadline() });
    assert.deepEqual([...(await gc.runGc()).deletedIds].sort(), [young.id, old.id].sort());
    assert.equal(await claimOf("old;"), undefined, "the key's claim went with its identity");
    assert.ok(await claimOf("young;"), "a claim written moments ago may be a node re-creating");
    await eventually(async () => {
      await gc.runGc();
      return await claimOf("young;") === undefined;
    }, "a later pass removes it once quiet");
  },
);

k8sTest(
  "an acquire between the mark and the delete keeps the identity; after its release it is marked anew and collected",
  async () => {
    await using fx = await fixture();
    const a = await fx.allocator("a", {}, QUICK);
    const gc = await fx.allocator("gc", {}, QUICK);
    const { id } = await a.allocate("k;");
    await a.release("k;");
    await pastHeartbeat();
    assert.equal((await gc.runGc()).marked, 1);
    assert.equal((await a.allocate("k;")).id, id, "joined: the mark is removed in the same write");
    assert.equal(await marked(fx, id), false);
    await pastHeartbeat();
    assert.deepEqual((await gc.runGc()).deletedIds, []);
    await a.release("k;");
    await pastHeartbeat();
    assert.equal((await gc.runGc()).marked, 1);
    await pastHeartbeat();
    assert.deepEqual((await gc.runGc()).deletedIds, [id]);
  },
);

k8sTest(
  "a guarded delete is refused when a joiner removed the mark after the listing; an unmarked candidate is marked and its references read again first",
  async () => {
    await using fx = await fixture();
    const s = await fx.session("a", QUICK);
    const { id } = await s.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
    await s.release("k;", id, deadline());
    await pastHeartbeat();
    const unmarked = (await first(s.gcList({ min: 1, max: 65535 }, deadline())))!;
    assert.deepEqual([unmarked.id, unmarked.inUse, unmarked.markedAt], [300, false, undefined]);
    // A join writes only the joiner's reference object: the version cannot show it, so a
    // candidate GC has not marked is marked, and its references read again, before any delete.
    const joiner = await fx.session("j", QUICK);
    await joiner.acquire({ key: "k;", pickCandidate: () => 999, signal: deadline() });
    assert.equal(await s.gcDelete(unmarked, deadline()), false, "the joiner's reference is read");
    assert.ok(await fx.identity(300));
    // (The joiner removes the mark that delete left, as a holder does.)
    await joiner.release("k;", id, deadline());
    await pastHeartbeat();
    const listed = (await first(s.gcList({ min: 1, max: 65535 }, deadline())))!;
    if (listed.markedAt === undefined) assert.ok(await s.gcMark!(listed, deadline()));
    await pastHeartbeat();
    const marked = (await first(s.gcList({ min: 1, max: 65535 }, deadline())))!;
    assert.deepEqual([marked.id, marked.inUse, marked.markedAt !== undefined], [300, false, true]);
    const other = await fx.session("b", QUICK);
    await eventually(() => other.informer.index.get(300)?.mark !== undefined, "b sees the mark");
    await other.acquire({ key: "k;", pickCandidate: () => 999, signal: deadline() });
    assert.equal(await s.gcDelete(marked, deadline()), false, "the joiner's unmark refuses it");
    assert.ok(await fx.identity(300));
    assert.equal(await s.gcMark!(marked, deadline()), undefined, "the mark is refused too");
  },
);

k8sTest("gcDelete never deletes a candidate listed in use, unchanged as it is", async () => {
  await using fx = await fixture();
  const s = await fx.session("a");
  await s.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
  const listed = (await first(s.gcList({ min: 1, max: 65535 }, deadline())))!;
  assert.deepEqual([listed.id, listed.inUse], [300, true]);
  assert.equal(await s.gcDelete(listed, deadline()), false, "a live reference keeps it");
  assert.ok(await fx.identity(300));
});

k8sTest(
  "gcDelete keeps an identity an endpoint named after the pass listed it unused (an agent whose cache lagged the mark)",
  async () => {
    await using fx = await fixture();
    // No grace: the pass may judge it at once (the allocator's GC applies its own grace).
    const s = await fx.session("a", {}, { gcGraceMs: 0 });
    await s.acquire({ key: "late;", pickCandidate: () => 300, signal: deadline() });
    await s.release("late;", 300, deadline());
    const listed = (await first(s.gcList({ min: 300, max: 300 }, deadline())))!;
    assert.deepEqual([listed.id, listed.inUse], [300, false], "listed unused: no endpoint yet");
    // A Cilium agent answers 300 from its cache and writes its endpoint after the pass's read.
    await fx.endpoint("pod-late", 300);
    const users = () => s.gcList({ min: 300, max: 300 }, deadline());
    await eventually(async () => (await first(users()))?.inUse === true, "the informer shows it");
    assert.equal(
      await s.gcDelete(listed, deadline()),
      false,
      "the informer shows the endpoint now",
    );
    assert.ok(await fx.identity(300), "kept");
  },
);

k8sTest(
  "a writable GC listing sweeps the dead references of identities in use, each only while it still has its dead epoch",
  async () => {
    await using fx = await fixture();
    const a = await fx.session("a", QUICK);
    const b = await fx.session("b", QUICK);
    // References of the layout before the reference objects: annotations on the identities.
    const ref = (node: string, epoch: string) => ({ [`ref.idalloc.io/${node}`]: epoch });
    const shared = { id: 300 };
    await fx.createIdentity(shared.id, { "idalloc:key": "k;" });
    await fx.patchIdentity(shared.id, {
      metadata: { annotations: { ...ref("a", a.lease!.epoch), ...ref("b", b.lease!.epoch) } },
    });
    const alone = { id: 302 };
    await fx.createIdentity(alone.id, { "idalloc:key": "j;" });
    await fx.patchIdentity(alone.id, { metadata: { annotations: ref("b", b.lease!.epoch) } });
    const dead = b.lease!.epoch;
    await b.close();
    await fx.client.delete(LEASES, nodeLeaseName("b"), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    const refs = async (id: number) =>
      Object.keys((await fx.identity(id))!.metadata.annotations!)
        .filter((k) => k.startsWith("ref.")).sort();
    await pastHeartbeat();

    const reader = await (await fx.backend("reader", QUICK)).openSession({
      leaseTtlMs: 3_000,
      readOnly: true,
      onLeaseReplaced: () => {},
    });
    for await (const _ of reader.gcList({ min: 1, max: 65535 }, deadline()));
    assert.deepEqual(await refs(shared.id), ["ref.idalloc.io/a", "ref.idalloc.io/b"], "read-only");

    const gc = await fx.session("gc", QUICK);
    const listed = [];
    for await (const c of gc.gcList({ min: 1, max: 65535 }, deadline())) listed.push(c);
    assert.deepEqual(listed.map((c) => [c.id, c.inUse]), [[300, true], [302, false]]);
    assert.deepEqual(await refs(shared.id), ["ref.idalloc.io/a"], "b's dead reference is gone");
    assert.deepEqual(await refs(alone.id), ["ref.idalloc.io/b"], "it goes with its identity");

    // The sweep's patch removes a reference only while it holds the dead epoch.
    await fx.patchIdentity(alone.id, { metadata: { annotations: { "ref.idalloc.io/b": "new" } } });
    await assert.rejects(
      fx.client.patch(fx.identities, String(alone.id), sweepPatch(new Map([["b", dead]])), {
        type: "json",
        signal: deadline(),
      }),
      { name: "KubeApiError", code: 422 },
    );
    assert.deepEqual(await refs(alone.id), ["ref.idalloc.io/b"]);
  },
);

k8sTest("a node whose Lease lapsed: its identities are collected", async () => {
  await using fx = await fixture();
  const dead = await fx.session("dead", QUICK);
  const { id } = await dead.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
  await dead.close(); // no release: the reference stays, its Lease lapses
  const gc = await fx.session("gc", QUICK);
  const unused = async () => {
    for await (const c of gc.gcList({ min: 1, max: 65535 }, deadline())) {
      if (c.id === id) return !c.inUse;
    }
    return false;
  };
  await eventually(unused, "the dead node's reference counts for nothing");
  const version = await gc.gcMark!(
    (await first(gc.gcList({ min: id, max: id }, deadline())))!,
    deadline(),
  );
  assert.ok(version);
  const listed = (await first(gc.gcList({ min: id, max: id }, deadline())))!;
  assert.deepEqual([listed.version, listed.inUse], [version, true], "marked just now");
  await pastHeartbeat();
  const marked = (await first(gc.gcList({ min: id, max: id }, deadline())))!;
  assert.equal(marked.version, version);
  assert.ok(marked.markedAt !== undefined && !marked.inUse);
  assert.equal(await gc.gcDelete(marked, deadline()), true);
  assert.equal(await fx.identity(id), undefined);
});

k8sTest("without an endpoint resource installed GC counts no endpoints", async () => {
  await using fx = await fixture();
  const s = await fx.session("a", { ...QUICK, endpoints: { plural: "nosuchendpoints" } });
  await s.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
  await s.release("k;", 300, deadline());
  await pastHeartbeat();
  const candidates = [];
  for await (const c of s.gcList({ min: 1, max: 65535 }, deadline())) candidates.push(c);
  assert.deepEqual(candidates.map((c) => [c.id, c.inUse]), [[300, false]]);
});

async function first<T>(items: AsyncIterable<T>): Promise<T | undefined> {
  for await (const item of items) return item;
  return undefined;
}
