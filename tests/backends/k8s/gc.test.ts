// GC's judgement on plain data (`users.ts`): an identity is in use while a reference on it is
// live (its node's Lease live and carrying its epoch), a CiliumEndpoint or a CiliumEndpointSlice
// names it, or it was written (created, changed, marked) less than Cilium's heartbeat timeout
// ago; the candidate carries the resource version and the time of a GC mark, whoever wrote it.
// On the real API server: GC marks with Cilium's annotation and deletes guarded by the version,
// never what a live node references or an endpoint or slice names, nor what was written within
// the heartbeat timeout (a short one here: the default is Cilium's 30 min); an acquire between
// mark and delete saves the identity; a lapsed node's identities are collected.
import assert from "node:assert/strict";
import { candidateOf } from "../../../src/backends/k8s/gc.ts";
import { claimName, nodeLeaseName, readIdentity } from "../../../src/backends/k8s/layout.ts";
import { CILIUM_HEARTBEAT_TIMEOUT_MS } from "../../../src/backends/k8s/limits.ts";
import { sweepPatch } from "../../../src/backends/k8s/patch.ts";
import { LEASES, resolveK8sOptions } from "../../../src/backends/k8s/options.ts";
import { endpointUsers, inUse, recentUntil, usedBy } from "../../../src/backends/k8s/users.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

const SKEW = 1_000;
const settings = { maxClockSkewMs: SKEW, heartbeatTimeoutMs: 60_000 };
const leases = new Map([
  ["live", { name: "idalloc-node-live", node: "live", epoch: "e1", expiresAt: 50_000, rv: "1" }],
  ["dead", { name: "idalloc-node-dead", node: "dead", epoch: "e1", expiresAt: 5_000, rv: "1" }],
]);

Deno.test("in use: a live reference of the Lease's epoch, an endpoint or slice naming the ID, a recent write", () => {
  const now = 10_000_000;
  const use = (users = new Map<number, string[]>()) => ({ leases, users, now, settings });
  const at = { ...use(), now: 10_000 };
  const rec = (refs: [string, string][], written = 0) => ({
    id: 300,
    refs: new Map(refs),
    written,
  });
  assert.equal(inUse(rec([["live", "e1"]]), at), true);
  assert.equal(inUse(rec([["live", "e0"]]), { ...at, now: 100_000 }), false, "old epoch");
  assert.equal(inUse(rec([["dead", "e1"]]), { ...at, now: 100_000 }), false, "lapsed");
  assert.equal(inUse(rec([["gone", "e1"]]), use()), false, "no Lease");
  assert.equal(inUse(rec([]), use(new Map([[300, ["CiliumEndpoint a/b"]]]))), true, "named");
  // Written (created, changed) or marked less than the heartbeat timeout (plus the skew margin,
  // and a second for the server's timestamps) ago: an agent may be about to name it.
  const until = now - settings.heartbeatTimeoutMs - SKEW - 1_000;
  assert.equal(inUse(rec([], until), use()), false);
  assert.equal(inUse(rec([], until + 1), use()), true, "written recently");
  const marked = { ...rec([]), mark: new Date(now - 60_000 - SKEW + 1).toISOString() };
  assert.equal(recentUntil(marked, settings), now + 1);
  assert.deepEqual(usedBy(marked, use()), [
    `written recently (in use until ${new Date(now).toISOString().replace(".000", "")})`,
  ]);
  assert.equal(inUse({ ...marked, mark: new Date(now - 61_000).toISOString() }, use()), false);
});

Deno.test("the heartbeat timeout is Cilium operator's default unless given", () => {
  assert.equal(CILIUM_HEARTBEAT_TIMEOUT_MS, 30 * 60_000);
  assert.equal(resolveK8sOptions({ node: "n" }).heartbeatTimeoutMs, 30 * 60_000);
  assert.equal(
    resolveK8sOptions({ node: "n", heartbeatTimeoutMs: 4_000 }).heartbeatTimeoutMs,
    4_000,
  );
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
      creationTimestamp: "2025-12-31T00:00:00Z",
      managedFields: [{ manager: "a", time: "2025-12-31T10:00:00Z" }, { manager: "b" }],
      annotations: { "io.cilium.heartbeat": "2026-01-01T00:00:00.123456789Z" },
    },
    "security-labels": { "idalloc:key": "k" },
  });
  assert.ok(read.ok);
  assert.equal(read.record.written, Date.parse("2025-12-31T10:00:00Z"), "the newest write");
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

// On the real API server.

k8sTest(
  "GC marks, then deletes guarded by the version: never what a live node references or a CiliumEndpoint names",
  async () => {
    await using fx = await fixture();
    const a = await fx.allocator("a");
    const b = await fx.allocator("b");
    const gc = await fx.allocator("gc", { gcGraceMs: 0 });
    const held = await a.allocate("held;");
    const named = await b.allocate("named;");
    await b.release("named;");
    await fx.endpoint("pod-1", named.id);
    const free = await b.allocate("free;");
    await b.release("free;");
    const marked = (id: number) =>
      fx.identity(id).then((o) => o?.metadata.annotations?.["io.cilium.heartbeat"] !== undefined);

    const first = await gc.runGc();
    assert.deepEqual([first.deleted, first.marked], [0, 1]);
    assert.deepEqual(await Promise.all([marked(held.id), marked(named.id), marked(free.id)]), [
      false,
      false,
      true,
    ]);
    const second = await gc.runGc();
    assert.deepEqual(second.deletedIds, [free.id]);
    assert.deepEqual((await fx.records()).map((r) => r.id).sort(), [held.id, named.id].sort());
  },
);

k8sTest(
  "the key's claim goes with its identity once quiet; a claim written recently stays for a later pass's sweep",
  async () => {
    await using fx = await fixture();
    // Claims are quiet 2.5 s after their last write (half the heartbeat timeout, plus the skew).
    const quick = { heartbeatTimeoutMs: 4_000 };
    const a = await fx.allocator("a", {}, quick);
    const gc = await fx.allocator("gc", { gcGraceMs: 0 }, quick);
    const claimOf = (key: string) =>
      fx.client.get(LEASES, claimName(`ciliumidentities.${fx.group}`, key), {
        namespace: fx.namespace,
        signal: deadline(),
      });
    const young = await a.allocate("young;");
    await a.release("young;");
    await gc.runGc();
    assert.deepEqual((await gc.runGc()).deletedIds, [young.id]);
    assert.ok(await claimOf("young;"), "a claim written moments ago may be a node re-creating");
    await eventually(async () => {
      await gc.runGc();
      return await claimOf("young;") === undefined;
    }, "a later pass removes it once quiet");

    const old = await a.allocate("old;");
    await a.release("old;");
    await gc.runGc();
    await new Promise((resolve) => setTimeout(resolve, 2_600)); // until its claim is quiet
    assert.deepEqual((await gc.runGc()).deletedIds, [old.id]);
    assert.equal(await claimOf("old;"), undefined, "the key's claim went with its identity");
  },
);

k8sTest(
  "an acquire between the mark and the delete keeps the identity; after its release it is marked anew and collected",
  async () => {
    await using fx = await fixture();
    const a = await fx.allocator("a");
    const gc = await fx.allocator("gc", { gcGraceMs: 0 });
    const { id } = await a.allocate("k;");
    await a.release("k;");
    assert.equal((await gc.runGc()).marked, 1);
    assert.equal((await a.allocate("k;")).id, id, "joined: the mark is removed in the same write");
    assert.equal((await fx.identity(id))!.metadata.annotations?.["io.cilium.heartbeat"], undefined);
    assert.deepEqual((await gc.runGc()).deletedIds, []);
    await a.release("k;");
    assert.equal((await gc.runGc()).marked, 1);
    assert.deepEqual((await gc.runGc()).deletedIds, [id]);
  },
);

k8sTest("a guarded delete is refused when the identity changed after it was listed", async () => {
  await using fx = await fixture();
  const s = await fx.session("a");
  const { id } = await s.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
  await s.release("k;", id, deadline());
  const candidates = [];
  for await (const c of s.gcList({ min: 1, max: 65535 }, deadline())) candidates.push(c);
  assert.deepEqual(candidates.map((c) => [c.id, c.inUse]), [[300, false]]);
  const other = await fx.session("b");
  await other.acquire({ key: "k;", pickCandidate: () => 999, signal: deadline() });
  assert.equal(await s.gcDelete(candidates[0], deadline()), false);
  assert.ok(await fx.identity(300));
  assert.equal(await s.gcMark!(candidates[0], deadline()), undefined, "the mark is refused too");
});

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
  "a writable GC listing sweeps the dead references of identities in use, each only while it still has its dead epoch",
  async () => {
    await using fx = await fixture();
    const a = await fx.session("a");
    const b = await fx.session("b");
    const shared = await a.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
    await b.acquire({ key: "k;", pickCandidate: () => 301, signal: deadline() }); // joins 300
    const alone = await b.acquire({ key: "j;", pickCandidate: () => 302, signal: deadline() });
    const dead = b.lease!.epoch;
    await b.close();
    await fx.client.delete(LEASES, nodeLeaseName("b"), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    const refs = async (id: number) =>
      Object.keys((await fx.identity(id))!.metadata.annotations!)
        .filter((k) => k.startsWith("ref.")).sort();

    const reader = await (await fx.backend("reader")).openSession({
      leaseTtlMs: 3_000,
      readOnly: true,
      onLeaseReplaced: () => {},
    });
    for await (const _ of reader.gcList({ min: 1, max: 65535 }, deadline()));
    assert.deepEqual(await refs(shared.id), ["ref.idalloc.io/a", "ref.idalloc.io/b"], "read-only");

    const gc = await fx.session("gc");
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
  const dead = await fx.session("dead");
  const { id } = await dead.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
  await dead.close(); // no release: the reference stays, its Lease lapses
  const gc = await fx.session("gc");
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
  const marked = (await first(gc.gcList({ min: id, max: id }, deadline())))!;
  assert.equal(marked.version, version);
  assert.ok(marked.markedAt !== undefined);
  assert.equal(await gc.gcDelete(marked, deadline()), true);
  assert.equal(await fx.identity(id), undefined);
});

k8sTest("without an endpoint resource installed GC counts no endpoints", async () => {
  await using fx = await fixture();
  const s = await fx.session("a", { endpoints: { plural: "nosuchendpoints" } });
  await s.acquire({ key: "k;", pickCandidate: () => 300, signal: deadline() });
  await s.release("k;", 300, deadline());
  const candidates = [];
  for await (const c of s.gcList({ min: 1, max: 65535 }, deadline())) candidates.push(c);
  assert.deepEqual(candidates.map((c) => [c.id, c.inUse]), [[300, false]]);
});

async function first<T>(items: AsyncIterable<T>): Promise<T | undefined> {
  for await (const item of items) return item;
  return undefined;
}
