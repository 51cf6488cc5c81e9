// References in the nodes' own reference objects (`refs.ts`), on a real kube-apiserver: a join
// does not write the shared identity (its size and version are the same with 1 and with many
// holders); an idle node sends only its Lease renewals; GC against a join, both orders of a
// joiner's unmark and GC's guarded delete; and a store written by the older layout (references as
// annotations on the identities) migrated without losing a reference.
import assert from "node:assert/strict";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import { countedClient, type KubeClient, type KubeObject } from "../../../src/backends/k8s/kube.ts";
import { nodeLeaseObject, nodeRefsObject, refsName } from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import type { K8sSession } from "../../../src/backends/k8s/session.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

type Fixture = Awaited<ReturnType<typeof fixture>>;

const picker = (...ids: number[]) => (exclude: ReadonlySet<number>) =>
  ids.find((id) => !exclude.has(id));

/** A writable session of `node` on `client` (closed with the returned function). */
async function sessionOn(
  fx: Fixture,
  node: string,
  client: KubeClient,
  leaseTtlMs = 3_000,
): Promise<{ session: K8sSession; close: () => Promise<void> }> {
  const backend = await K8sBackend.connect(fx.options(node), { client });
  const session = await backend.openSession({
    leaseTtlMs,
    readOnly: false,
    onLeaseReplaced: () => {},
  }) as K8sSession;
  await session.informer.waitSynced(deadline());
  return { session, close: () => backend.close() };
}

/** A client that records `<method> <resource>` of every call made through it. */
function recording(client: KubeClient): { client: KubeClient; calls: string[] } {
  const calls: string[] = [];
  const wrapped: KubeClient = { ...countedClient(client, { count: 0 }) };
  for (const method of ["get", "list", "create", "patch", "delete", "watch"] as const) {
    // deno-lint-ignore no-explicit-any
    (wrapped as any)[method] = (res: { plural: string }, ...rest: unknown[]) => {
      calls.push(`${method} ${res.plural}`);
      // deno-lint-ignore no-explicit-any
      return (client as any)[method](res, ...rest);
    };
  }
  return { client: wrapped, calls };
}

/** The identity object's size in bytes as the API server stores it (JSON, managed fields out). */
function sizeOf(obj: KubeObject): number {
  const { managedFields: _m, ...metadata } = obj.metadata as Record<string, unknown>;
  return new TextEncoder().encode(JSON.stringify({ ...obj, metadata })).length;
}

k8sTest(
  "joins write only the joiners' reference objects: the identity's size and version do not change with 1 or 12 holders",
  async () => {
    await using fx = await fixture();
    const first = await fx.session("n0");
    const key = "k8s:app=daemonset;";
    const { id } = await first.acquire({ key, pickCandidate: picker(300), signal: deadline() });
    const alone = (await fx.identity(id))!;
    const joiners: K8sSession[] = [];
    for (let i = 1; i < 12; i++) joiners.push(await fx.session(`n${i}`));
    for (const s of joiners) {
      await eventually(() => s.informer.index.answer(key) !== undefined, "the joiner sees it");
      assert.equal(
        (await s.acquire({ key, pickCandidate: picker(999), signal: deadline() })).id,
        id,
      );
    }
    const shared = (await fx.identity(id))!;
    assert.equal(shared.metadata.resourceVersion, alone.metadata.resourceVersion, "not written");
    assert.equal(sizeOf(shared), sizeOf(alone));
    for (const [i, s] of [first, ...joiners].entries()) {
      assert.deepEqual([...await fx.held(`n${i}`)], [[id, s.lease!.epoch]]);
    }
    const admin = (await fx.backend("admin")).admin();
    const refs = [];
    for await (const r of admin.references(deadline())) refs.push(r);
    assert.equal(refs.filter((r) => r.id === id && r.live).length, 12);
  },
);

k8sTest(
  "an idle node holding keys sends only its Lease renewals: ensure reads nothing, no identity is read or written",
  async () => {
    await using fx = await fixture();
    const rec = recording(fx.client);
    const { session, close } = await sessionOn(fx, "idle", rec.client);
    try {
      const held: { key: string; id: number }[] = [];
      for (let i = 0; i < 5; i++) {
        const key = `k8s:app=idle-${i};`;
        const { id } = await session.acquire({
          key,
          pickCandidate: picker(400 + i),
          signal: deadline(),
        });
        held.push({ key, id });
      }
      await eventually(() => held.every((h) => session.informer.index.get(h.id)), "indexed");
      rec.calls.length = 0;
      const started = Date.now();
      // Three syncs and about three renewals (a third of the 3 s lease each).
      for (let i = 0; i < 3; i++) {
        assert.ok((await session.ensure(held, deadline())).every((r) => r.reference === "ok"));
        await new Promise((resolve) => setTimeout(resolve, 1_000));
      }
      const elapsed = Date.now() - started;
      assert.ok(rec.calls.length > 0, "it renewed");
      assert.deepEqual(
        [...new Set(rec.calls)],
        ["patch leases"],
        `only Lease renewals in ${elapsed} ms: ${rec.calls.join(", ")}`,
      );
      assert.ok(rec.calls.length <= Math.ceil(elapsed / 1_000) + 1, rec.calls.join(", "));
    } finally {
      await close();
    }
  },
);

k8sTest(
  "GC against a join: the joiner that finds the mark removes it and the guarded delete is refused; a delete that lands first makes the joiner re-create the same ID from its claim",
  async () => {
    await using fx = await fixture();
    const gcBackend = await fx.backend("gc", { gcGraceMs: 0 });
    const gc = await gcBackend.openSession({
      leaseTtlMs: 3_000,
      readOnly: false,
      onLeaseReplaced: () => {},
      gcGraceMs: 0,
    }) as K8sSession;
    const a = await fx.session("a");
    const key = "k8s:app=race;";
    const { id } = await a.acquire({ key, pickCandidate: picker(500), signal: deadline() });
    await a.release(key, id, deadline());
    const listed = async () => {
      for await (const c of gc.gcList({ min: id, max: id }, deadline())) return c;
      throw new Error("not listed");
    };
    const unused = await listed();
    assert.equal(unused.inUse, false);
    assert.ok(await gc.gcMark!(unused, deadline()));
    const marked = await listed();
    assert.ok(marked.markedAt !== undefined && !marked.inUse);

    // 1. The joiner's unmark lands before the delete: refused, the identity stays held.
    const b = await fx.session("b");
    await eventually(() => b.informer.index.get(id)?.mark !== undefined, "b sees the mark");
    assert.equal((await b.acquire({ key, pickCandidate: picker(999), signal: deadline() })).id, id);
    assert.equal(await gc.gcDelete(marked, deadline()), false, "the unmark changed the version");
    assert.ok(await fx.identity(id));
    assert.equal((await fx.held("b")).get(id), b.lease!.epoch);
    const now = await listed();
    assert.deepEqual([now.inUse, now.markedAt], [true, undefined], "held, unmarked");

    // 2. The delete lands first: c's unmark finds the identity gone (404), and c re-creates the
    // same ID from the key's claim (the claim was written recently, so GC's delete kept it).
    await b.release(key, id, deadline());
    assert.ok(await gc.gcMark!(await listed(), deadline()));
    const again = await listed();
    assert.ok(again.markedAt !== undefined && !again.inUse);
    let deletedFirst = false;
    const racing: KubeClient = { ...countedClient(fx.client, { count: 0 }) };
    racing.patch = async (res, name, body, options) => {
      if (res.plural === fx.identities.plural && name === String(id) && !deletedFirst) {
        deletedFirst = await gc.gcDelete(again, deadline());
      }
      return await fx.client.patch(res, name, body, options);
    };
    const c = await sessionOn(fx, "c", racing);
    try {
      await eventually(() => c.session.informer.index.get(id)?.mark !== undefined, "c sees it");
      const joined = await c.session.acquire({
        key,
        pickCandidate: picker(501),
        signal: deadline(),
      });
      assert.ok(deletedFirst, "GC's delete landed before c's unmark");
      assert.deepEqual([joined.id, joined.created], [id, true], "re-created under the same ID");
      const back = (await fx.identity(id))!;
      assert.equal(back.metadata.annotations?.["io.cilium.heartbeat"], undefined);
      assert.equal((await fx.held("c")).get(id), c.session.lease!.epoch);
      assert.equal((await fx.records()).filter((r) => r.key === key).length, 1, "one identity");
    } finally {
      await c.close();
    }
  },
);

k8sTest(
  "migration: a store written by the older layout (reference annotations) keeps every reference; GC deletes nothing held; dead ones are swept",
  async () => {
    await using fx = await fixture();
    // Two nodes of the older layout: live Leases, references as annotations on the identities.
    const now = Date.now();
    for (const [node, epoch] of [["old1", "e1old1"], ["old2", "e1old2"]]) {
      await fx.client.create(LEASES, nodeLeaseObject(node, epoch, 60, now, now), {
        namespace: fx.namespace,
        signal: deadline(),
      });
    }
    const oldRef = (node: string) => `ref.idalloc.io/${node}`;
    const identity = async (id: number, key: string, refs: Record<string, string>) => {
      await fx.createIdentity(id, { "idalloc:key": key });
      await fx.patchIdentity(id, { metadata: { annotations: refs } });
    };
    await identity(300, "shared;", { [oldRef("old1")]: "e1old1", [oldRef("old2")]: "e1old2" });
    await identity(301, "only-old2;", { [oldRef("old2")]: "e1old2" });
    await identity(302, "dead;", { [oldRef("gone")]: "e0" });

    // An upgraded node joins the shared key: same ID, its reference in its own object.
    const a = await fx.allocator("a");
    assert.deepEqual(await a.allocate("shared;"), { id: 300, isNew: false, firstUse: true });
    assert.equal((await fx.held("a")).has(300), true);

    // Readers honour both layouts.
    const admin = (await fx.backend("admin")).admin();
    const refs = [];
    for await (const r of admin.references(deadline())) refs.push([r.id, r.node, r.live]);
    assert.deepEqual(refs.sort(), [
      [300, "a", true],
      [300, "old1", true],
      [300, "old2", true],
      [301, "old2", true],
      [302, "gone", false],
    ]);

    // GC with no grace, pass after pass: only the identity nobody live references goes.
    const gc = await fx.allocator("gc", { gcGraceMs: 0 });
    const deleted: number[] = [];
    for (let pass = 0; pass < 3; pass++) deleted.push(...(await gc.runGc()).deletedIds);
    assert.deepEqual(deleted, [302]);
    assert.deepEqual((await fx.records()).map((r) => r.id).sort(), [300, 301]);
    // old2 stops (its Lease goes): its references are dead, swept from the shared identity, and
    // the identity only it held is collected.
    await fx.client.delete(LEASES, "idalloc-node-old2", {
      namespace: fx.namespace,
      signal: deadline(),
    });
    for (let pass = 0; pass < 3; pass++) deleted.push(...(await gc.runGc()).deletedIds);
    assert.deepEqual(deleted, [302, 301]);
    const shared = (await fx.identity(300))!.metadata.annotations!;
    assert.equal(shared[oldRef("old1")], "e1old1", "the live old node's reference stays");
    assert.equal(shared[oldRef("old2")], undefined, "the dead one is swept");
    assert.equal(await a.get("shared;"), 300);
  },
);

k8sTest(
  "migration: reference objects of per-ID annotations (the first per-node layout) keep every reference; a node's first write packs them",
  async () => {
    await using fx = await fixture();
    // A running node of the per-ID layout: live Lease, one annotation per reference.
    const now = Date.now();
    await fx.client.create(LEASES, nodeLeaseObject("old", "e1old", 60, now, now), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    const perId = (node: string, refs: Record<number, string>) => ({
      ...nodeRefsObject(node, new Map()),
      metadata: {
        ...nodeRefsObject(node, new Map()).metadata,
        annotations: Object.fromEntries(
          Object.entries(refs).map(([id, epoch]) => [`held.idalloc.io/${id}`, epoch]),
        ),
      },
    });
    await fx.client.create(LEASES, perId("old", { 300: "e1old", 301: "e1old" }), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    // And the object an upgraded node left from its earlier process (a dead epoch).
    await fx.client.create(LEASES, perId("b", { 302: "e0b" }), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    for (const [id, key] of [[300, "one;"], [301, "two;"], [302, "three;"]] as const) {
      await fx.createIdentity(id, { "idalloc:key": key });
    }
    const admin = (await fx.backend("admin")).admin();
    const refs = [];
    for await (const r of admin.references(deadline())) refs.push([r.id, r.node, r.live]);
    assert.deepEqual(refs.sort(), [[300, "old", true], [301, "old", true], [302, "b", false]]);
    // GC with no grace, pass after pass: nothing the per-ID node references goes.
    const gc = await fx.allocator("gc", { gcGraceMs: 0 });
    const deleted: number[] = [];
    for (let pass = 0; pass < 3; pass++) deleted.push(...(await gc.runGc()).deletedIds);
    assert.deepEqual(deleted, [302]);
    // The upgraded node b starts: its first write is the packed list, its per-ID annotations gone.
    const b = await fx.allocator("b");
    assert.equal((await b.allocate("one;")).id, 300);
    const obj = (await fx.client.get(LEASES, refsName("b"), {
      namespace: fx.namespace,
      signal: deadline(),
    }))!;
    const annotations = obj.metadata.annotations ?? {};
    assert.deepEqual(Object.keys(annotations).filter((a) => a.startsWith("held.")), []);
    assert.match(annotations["idalloc.io/held"], /^300=[0-9a-f]+$/);
    assert.deepEqual((await fx.records()).map((r) => r.id).sort(), [300, 301]);
  },
);

k8sTest(
  "GC removes the reference object of a node whose Lease is gone, guarded by its version; a node that comes back writes it again",
  async () => {
    await using fx = await fixture();
    // A reference object left by a node that is gone (no Lease), and a live node's.
    await fx.client.create(LEASES, nodeRefsObject("gone", new Map([[300, "e0"]])), {
      namespace: fx.namespace,
      signal: deadline(),
    });
    const live = await fx.session("live");
    const { id } = await live.acquire({
      key: "k;",
      pickCandidate: picker(301),
      signal: deadline(),
    });
    const gc = await fx.session("gc");
    for await (const _ of gc.gcList({ min: 1, max: 65535 }, deadline()));
    assert.deepEqual([...await fx.held("gone")], [], "gone");
    assert.deepEqual([...await fx.held("live")], [[id, live.lease!.epoch]], "kept");
    // Removed under a live node (by hand): its next write creates it again with all it holds.
    await fx.client.delete(LEASES, "idalloc-refs-live", {
      namespace: fx.namespace,
      signal: deadline(),
    });
    await live.acquire({ key: "j;", pickCandidate: picker(302), signal: deadline() });
    assert.deepEqual(
      [...(await fx.held("live")).keys()].sort(),
      [id, 302],
      "both references written again",
    );
  },
);

k8sTest(
  "the doctor removes one bad entry of a packed list, guarded by the object's version, and keeps the rest",
  async () => {
    await using fx = await fixture();
    const obj = nodeRefsObject("gone", new Map([[300, "e0"]]));
    obj.metadata.annotations!["idalloc.io/held"] = "300=e0,bogus";
    await fx.client.create(LEASES, obj, { namespace: fx.namespace, signal: deadline() });
    const backend = await fx.backend("doctor");
    const findings = [];
    for await (const f of backend.findDamage()) findings.push(f);
    const bad = findings.filter((f) => f.entry.includes("bogus"));
    assert.deepEqual(bad.map((f) => f.kind), ["reference-bad-key"]);
    assert.equal(await backend.removeDamage(bad[0]), true);
    const after = (await fx.client.get(LEASES, refsName("gone"), {
      namespace: fx.namespace,
      signal: deadline(),
    }))!;
    assert.equal(after.metadata.annotations?.["idalloc.io/held"], "300=e0");
    // The token's version is stale now: a second removal is refused, nothing changes.
    assert.equal(await backend.removeDamage(bad[0]), false);
  },
);
