// Drift between Cilium's two stores, seen and repaired: `doctor` in a double-write mode lists an
// identity on one side only, an ID whose label sets differ and a label set whose IDs differ; `doctor
// --fix` copies the one-sided ones across under the other store's guards and replaces a conflict's
// entry on the side not read only once nothing uses it there. Drift is planted by writing one side
// directly (a node on that store alone); the nodes holding IDs keep them throughout.
import assert from "node:assert/strict";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import type { IdentityAllocationMode } from "../../../src/backends/doublewrite/mod.ts";
import { cli } from "../../cli/_run.ts";
import { startStores, type Stores } from "./_world.ts";

const ignore = kubeApiserverUnavailable() !== undefined || etcdUnavailable() !== undefined;

/** One finding of `doctor --json`. */
interface Finding {
  readonly kind: string;
  readonly id?: number;
  readonly heldBy?: readonly string[];
  readonly outcome?: string;
}

async function doctor(
  stores: Stores,
  mode: IdentityAllocationMode,
  fix: boolean,
): Promise<{ code: number; findings: Finding[]; stderr: string }> {
  const r = await cli([
    ...stores.cli(mode, ["--heartbeat-timeout", "4s"]),
    "doctor",
    ...(fix ? ["--fix"] : []),
    "--json",
  ]);
  const findings = r.stdout.trim() === "" ? [] : JSON.parse(r.stdout) as Finding[];
  return { code: r.code, findings, stderr: r.stderr };
}

/**
 * Past the time an identity counts as new for the doctor: its creation (second resolution, so
 * +1 s) plus the 1 s clock skew plus the 4 s heartbeat timeout (above the 3 s lease TTL, as it
 * must be); and so past a key claim's quiet time (2 s + 1 s skew).
 */
const quiet = () => new Promise((r) => setTimeout(r, 7_000));

/** Findings in ID order (IDs are picked by hash: the order of the planted ones is not known). */
const byId = <T extends { id?: number }>(list: T[]) =>
  list.sort((a, b) => (a.id ?? 0) - (b.id ?? 0));

/** The drift findings only (the sides' own damage is the side doctors' tests' business). */
const drift = (findings: readonly Finding[]) =>
  byId(
    findings.filter((f) =>
      ["kvstore-only", "crd-only", "labels-differ", "key-split"].includes(f.kind)
    )
      .map((f) => ({ kind: f.kind, id: f.id, ...(f.outcome ? { outcome: f.outcome } : {}) })),
  );

Deno.test({
  name: "doctor: identities on one side only are listed and copied across; held IDs stay",
  ignore,
  async fn() {
    await using s = await startStores();
    {
      // A kvstore node holds one identity and let another go; a CRD node let one go; a
      // double-write node holds one on both sides (no drift).
      await using etcdNode = await s.node("kvstore", "e1");
      const held = (await etcdNode.alloc.allocate("k8s:app=held-on-kvstore;")).id;
      const gone = (await etcdNode.alloc.allocate("k8s:app=released-on-kvstore;")).id;
      await etcdNode.alloc.release("k8s:app=released-on-kvstore;");
      {
        await using crdNode = await s.node("crd", "k1", { min: 40000 });
        const r = await crdNode.alloc.allocate("k8s:app=released-on-crd;");
        assert.ok(r.id >= 40000);
        await crdNode.alloc.release("k8s:app=released-on-crd;");
      }
      await using dw = await s.node("doublewrite-readkvstore", "d1");
      const both = (await dw.alloc.allocate("k8s:app=both;")).id;
      const crdOnly = (await s.sides()).crd;
      const crdId = [...crdOnly].find(([, k]) => k === "k8s:app=released-on-crd;")![0];

      const listed = await doctor(s, "doublewrite-readkvstore", false);
      assert.equal(listed.code, 4, listed.stderr);
      assert.deepEqual(
        drift(listed.findings),
        byId([
          { kind: "kvstore-only", id: held },
          { kind: "kvstore-only", id: gone },
          { kind: "crd-only", id: crdId },
        ]),
      );
      const status = await cli([...s.cli("doublewrite-readcrd"), "status", "--json"]);
      assert.equal(status.code, 0, status.stderr);
      const model = JSON.parse(status.stdout);
      assert.deepEqual(model.doubleWrite, {
        crd: { total: 2, only: 1 },
        kvstore: { total: 3, only: 2 },
        differing: [],
      });
      assert.equal(model.metrics["idalloc.identity.kvstore.only_count"], 2);
      assert.equal(model.metrics["idalloc.identity.crd.only_count"], 1);

      const fixed = await doctor(s, "doublewrite-readkvstore", true);
      assert.equal(fixed.code, 0, fixed.stderr);
      assert.deepEqual(
        drift(fixed.findings),
        byId([
          { kind: "kvstore-only", id: held, outcome: "copied" },
          { kind: "kvstore-only", id: gone, outcome: "copied" },
          { kind: "crd-only", id: crdId, outcome: "copied" },
        ]),
      );
      const after = await s.sides();
      assert.deepEqual([...after.kvstore].sort(), [...after.crd].sort(), "both sides alike");
      assert.equal(after.kvstore.size, 4);
      // No ID changed: the holders answer as before, from the store too.
      assert.equal(await etcdNode.alloc.getNoCache("k8s:app=held-on-kvstore;"), held);
      assert.equal(await dw.alloc.getNoCache("k8s:app=both;"), both);
      assert.equal(after.crd.get(held), "k8s:app=held-on-kvstore;");
      assert.equal(after.kvstore.get(crdId), "k8s:app=released-on-crd;");
      const again = await doctor(s, "doublewrite-readcrd", false);
      assert.equal(again.code, 0, again.stderr);
      assert.deepEqual(drift(again.findings), []);
    }
  },
});

Deno.test({
  name:
    "doctor: conflicts are held while used on the side not read, then replaced from the read side",
  ignore,
  async fn() {
    await using s = await startStores();
    {
      // ID 30000: app=kv on the kvstore (held there), app=crd on the CRDs (held there, for now).
      await using kvHolder = await s.plant("kvstore", "e1", "k8s:app=kv;", 30000);
      await using crdHolder = await s.plant("crd", "k1", "k8s:app=crd;", 30000);
      // app=split: ID 31000 on the kvstore, 32000 on the CRDs (nobody holds it).
      {
        await using a = await s.plant("kvstore", "e2", "k8s:app=split;", 31000);
        await using b = await s.plant("crd", "k2", "k8s:app=split;", 32000);
        await a.release();
        await b.release();
      }
      const listed = await doctor(s, "doublewrite-readkvstore", false);
      assert.deepEqual(drift(listed.findings), [
        { kind: "labels-differ", id: 30000 },
        { kind: "key-split", id: 31000 },
      ]);
      const differs = listed.findings.find((f) => f.kind === "labels-differ")!;
      assert.deepEqual(differs.heldBy, ["k1"], "the CRD side's entry is k1's");

      // Reading the kvstore, the CRD side gives way: ID 30000 is held there, so it stays; the
      // split's CRD ID (32000) is unused once past the 4 s heartbeat timeout, and its key claim
      // quiet (half of it plus the 1 s clock skew), so it goes with its claim.
      await quiet();
      const first = await doctor(s, "doublewrite-readkvstore", true);
      assert.equal(first.code, 4, first.stderr);
      assert.deepEqual(
        drift(first.findings),
        [
          { kind: "labels-differ", id: 30000, outcome: "held" },
          { kind: "key-split", id: 31000, outcome: "copied" },
        ],
        JSON.stringify(first.findings),
      );
      let sides = await s.sides();
      assert.equal(sides.crd.get(30000), "k8s:app=crd;", "a held entry is never replaced");
      assert.equal(sides.crd.get(31000), "k8s:app=split;");
      assert.equal(sides.crd.has(32000), false);

      // Once k1 lets app=crd go, its entry is replaced by the kvstore's, which e1 still holds.
      await crdHolder.release();
      await quiet();
      const second = await doctor(s, "doublewrite-readkvstore", true);
      assert.equal(second.code, 0, second.stderr);
      assert.deepEqual(drift(second.findings), [
        { kind: "labels-differ", id: 30000, outcome: "copied" },
      ]);
      sides = await s.sides();
      assert.equal(sides.crd.get(30000), "k8s:app=kv;");
      assert.equal(sides.kvstore.get(30000), "k8s:app=kv;", "e1's ID is untouched");
      void kvHolder;
    }
  },
});

Deno.test({
  name: "doctor: reading the CRDs, a split's kvstore ID gives way to the CRD's",
  ignore,
  async fn() {
    await using s = await startStores();
    {
      {
        await using a = await s.plant("kvstore", "e1", "k8s:app=split;", 31000);
        await using b = await s.plant("crd", "k1", "k8s:app=split;", 32000);
        await a.release();
        void b;
      }
      // k1's session closed with the key held (its reference lapses with its lease); the CRD
      // side is the one read, so only the kvstore's ID (unreferenced) may go.
      const fixed = await doctor(s, "doublewrite-readcrd", true);
      assert.equal(fixed.code, 0, fixed.stderr);
      assert.deepEqual(drift(fixed.findings), [
        { kind: "key-split", id: 31000, outcome: "copied" },
      ]);
      const sides = await s.sides();
      assert.equal(sides.kvstore.has(31000), false);
      assert.equal(sides.kvstore.get(32000), "k8s:app=split;");
      assert.equal(sides.crd.get(32000), "k8s:app=split;");
    }
  },
});
