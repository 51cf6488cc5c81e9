// The operator's view of a Kubernetes store (BackendAdmin) and its damage report (StoreDoctor),
// on a real API server: node Leases and references with their liveness; a reference of a live node
// is never deleted; every kind of damage is found, removed when nobody holds it, refused when a
// live node does.
import assert from "node:assert/strict";
import type { DamageFinding } from "../../../src/allocator/damage.ts";
import { claimName, nodeLeaseObject } from "../../../src/backends/k8s/layout.ts";
import { LEASES } from "../../../src/backends/k8s/options.ts";
import { deadline, eventually, fixture, k8sTest } from "./_helpers.ts";

k8sTest(
  "admin: namespace, node Leases, references with liveness; a live node's reference is kept",
  async () => {
    await using fx = await fixture();
    const admin = (await fx.backend("operator")).admin();
    assert.equal(admin.namespace, `ciliumidentities.${fx.group}/v2`);
    assert.equal(await admin.namespaceExists(deadline()), false);
    const a = await fx.session("a");
    const b = await fx.session("b");
    const k1 = await a.acquire({ key: "k1;", pickCandidate: () => 300, signal: deadline() });
    await b.acquire({ key: "k1;", pickCandidate: () => 999, signal: deadline() });
    await b.acquire({ key: "k2;", pickCandidate: () => 301, signal: deadline() });
    assert.equal(await admin.namespaceExists(deadline()), true);
    assert.deepEqual(
      (await admin.nodeLeases(deadline())).map((l) => [l.node, l.live]),
      [["a", true], ["b", true]],
    );
    const refs = [];
    for await (const r of admin.references(deadline())) refs.push(r);
    assert.deepEqual(refs.map((r) => [r.key, r.node, r.id, r.live]), [
      ["k1;", "a", k1.id, true],
      ["k1;", "b", k1.id, true],
      ["k2;", "b", 301, true],
    ]);
    await assert.rejects(() => admin.deleteReference("k2;", "b", deadline()), {
      name: "LiveEntryError",
    });
    await b.close(); // its Lease lapses; its references stay behind
    await eventually(
      async () => !(await admin.nodeLeases(deadline())).find((l) => l.node === "b")!.live,
      "b's Lease lapsed",
    );
    assert.equal(await admin.deleteReference("k2;", "b", deadline()), true);
    assert.equal(await admin.deleteReference("k2;", "b", deadline()), false);
    // b's reference object keeps only k1's; the identity never carried one.
    assert.deepEqual([...(await fx.held("b")).keys()], [k1.id]);
    assert.deepEqual(Object.keys((await fx.identity(301))!.metadata.annotations ?? {}).sort(), [
      "idalloc.io/creator",
      "idalloc.io/lease-namespace",
    ]);
  },
);

k8sTest(
  "doctor: every kind of damage is found; removed when unheld, refused when a live node holds it",
  async () => {
    await using fx = await fixture();
    // No grace: the duplicates made here a moment ago are unused by GC's rule, which this test
    // removes; the store's default grace (Cilium's heartbeat timeout) would hold them as new.
    const backend = await fx.backend("operator", { gcGraceMs: 0 });
    const a = await fx.session("a");
    // A duplicate held by a live node (the newer of two identities of one key).
    await fx.createIdentity(400, { "idalloc:key": "dup;" });
    const second0 = Math.floor(Date.now() / 1000);
    await eventually(() => Math.floor(Date.now() / 1000) > second0, "the next second");
    await fx.createIdentity(401, { "idalloc:key": "dup;" });
    await fx.patchIdentity(401, {
      metadata: { annotations: { "ref.idalloc.io/a": a.lease!.epoch } },
    });
    // Unheld damage.
    await fx.createIdentity(402, { "idalloc:key": "other;" });
    await fx.createIdentity(403, { "idalloc:key": "other;" });
    await fx.client.create(fx.identities, {
      metadata: { name: "web" },
      "security-labels": { "k8s:app": "web" },
    }, { signal: deadline() });
    await fx.createIdentity(900, { app: "no-source" });
    await fx.createIdentity(901, { "idalloc:key": "refs;" });
    await fx.patchIdentity(901, {
      // (An annotation name that is no node name cannot exist: the API server refuses it.)
      metadata: { annotations: { "ref.idalloc.io/n9": "" } },
    });
    const leases = { namespace: fx.namespace, signal: deadline() };
    await fx.client.create(LEASES, {
      metadata: {
        name: claimName(`ciliumidentities.${fx.group}`, "gone;"),
        labels: {
          "app.kubernetes.io/managed-by": "idalloc",
          "idalloc.io/role": "claim",
          "idalloc.io/id": "950",
        },
        annotations: { "idalloc.io/key": "gone;" },
      },
      spec: {},
    }, leases);
    // The claim of a key whose identity (900) is damaged: not stale, removed with the identity.
    const nineClaim = claimName(`ciliumidentities.${fx.group}`, "nine;");
    await fx.client.create(LEASES, {
      metadata: {
        name: nineClaim,
        labels: {
          "app.kubernetes.io/managed-by": "idalloc",
          "idalloc.io/role": "claim",
          "idalloc.io/id": "900",
        },
        annotations: { "idalloc.io/key": "nine;" },
      },
      spec: {},
    }, leases);
    await fx.client.create(LEASES, {
      metadata: {
        name: "idalloc-key-garbage",
        labels: { "app.kubernetes.io/managed-by": "idalloc", "idalloc.io/role": "claim" },
      },
      spec: {},
    }, leases);
    const noEpoch = nodeLeaseObject("zz", "x", 10, Date.now(), Date.now());
    delete noEpoch.metadata.annotations;
    await fx.client.create(LEASES, noEpoch, leases);

    const findings: DamageFinding[] = [];
    for await (const f of backend.findDamage({ range: { min: 256, max: 65535 } })) findings.push(f);
    const summary = findings.map((f) => `${f.kind} ${f.id ?? "-"} ${f.heldBy?.join(",") ?? ""}`)
      .sort();
    assert.deepEqual(summary, [
      "claim-stale 950 ",
      "claim-undecodable - ",
      "key-duplicate 401 a",
      "key-duplicate 403 ",
      "master-bad-id - ",
      "master-undecodable 900 ",
      "node-lease-undecodable - ",
      "reference-undecodable 901 ",
    ]);
    for (const f of findings) {
      if (f.heldBy !== undefined) {
        await assert.rejects(() => backend.removeDamage(f), { name: "LiveEntryError" });
      } else {
        assert.equal(await backend.removeDamage(f), true, `${f.kind} ${f.entry}`);
      }
    }
    const after: string[] = [];
    for await (const f of backend.findDamage()) after.push(`${f.kind} ${f.id}`);
    assert.deepEqual(after, ["key-duplicate 401"]);
    assert.equal(await fx.client.get(LEASES, nineClaim, leases), undefined);
    assert.deepEqual((await fx.records()).map((r) => r.id).sort(), [400, 401, 402, 901]);

    const other = await fixture();
    try {
      const foreign = await other.backend("operator");
      await assert.rejects(() => foreign.removeDamage(findings[0]), {
        name: "InvalidOptionsError",
      });
    } finally {
      await other[Symbol.asyncDispose]();
    }
  },
);
