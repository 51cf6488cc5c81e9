// The store's record beside Cilium CRD-mode nodes, on a real kube-apiserver: identities as
// masters and their idalloc references, the nemesis's CiliumEndpoints as Cilium nodes'
// references, node Leases, and a deleted identity with its last state — all in the store's
// order; and the endpoint writer's CiliumEndpoints as a Cilium agent writes them. Skipped
// (loudly) where kube-apiserver is not built.
import assert from "node:assert/strict";
import { checkDeletions } from "../../nemesis/checks/deletions.ts";
import type { StoreChange } from "../../src/testing/store_changes.ts";
import { LEASES } from "../../src/backends/k8s/options.ts";
import {
  endpointName,
  endpointResource,
  EndpointWriter,
  recordK8sChanges,
} from "../../src/backends/k8s/testing/nemesis_cilium.ts";
import { endpointCrd } from "../../src/backends/k8s/testing/crds.ts";
import { eventually, k8sTest, sharedCluster } from "../backends/k8s/_helpers.ts";

const KEY = "k8s:app=k3;";

k8sTest(
  "k8s record: masters, references, endpoints, Leases and a deletion's last state, in the store's order",
  async () => {
    const cluster = await sharedCluster();
    const identities = await cluster.installIdentityCrd();
    await cluster.installCrd(endpointCrd(identities.group));
    const namespace = "default";
    await using client = await cluster.client("admin", namespace);
    const changes: StoreChange[] = [];
    await using _recorder = await recordK8sChanges(
      { client, identities, namespace },
      (c) => changes.push(c),
    );
    const expiresAt = Date.now() + 60_000;
    await client.create(LEASES, {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: {
        name: "idalloc-node-w0",
        labels: { "app.kubernetes.io/managed-by": "idalloc", "idalloc.io/role": "node" },
        annotations: { "idalloc.io/epoch": "e1" },
      },
      spec: {
        holderIdentity: "w0",
        renewTime: new Date(expiresAt - 30_000).toISOString().replace("Z", "000Z"),
        leaseDurationSeconds: 30,
      },
    }, { namespace });
    await client.create(identities, {
      apiVersion: `${identities.group}/v2`,
      metadata: { name: "300", annotations: { "ref.idalloc.io/w0": "e1" } },
      "security-labels": { "k8s:app": "k3" },
    });
    await using writer = new EndpointWriter(client, identities, namespace);
    writer.set("c0", KEY, 300);
    await writer.flush(10_000);
    const cep = await client.get(endpointResource(identities), endpointName("c0", KEY), {
      namespace,
    });
    assert.deepEqual((cep?.status as { identity: unknown }).identity, { id: 300 });
    await client.delete(identities, "300");
    await eventually(() => changes.some((c) => c.t === "deleted"), "the deletion recorded");

    const kinds = changes.map((c) => c.t);
    assert.deepEqual(kinds.filter((t) => t !== "gap"), [
      "lease",
      "master",
      "ref",
      "ref",
      "master",
      "ref",
      "deleted",
    ]);
    const deleted = changes.find((c): c is Extract<StoreChange, { t: "deleted" }> =>
      c.t === "deleted"
    )!;
    assert.deepEqual(
      { id: deleted.id, key: deleted.key, refs: deleted.refs },
      { id: 300, key: KEY, refs: { w0: "e1" } },
    );
    const endpointRef = changes.find((c): c is Extract<StoreChange, { t: "ref" }> =>
      c.t === "ref" && c.lease === "cep"
    );
    assert.deepEqual(
      endpointRef && { node: endpointRef.node, id: endpointRef.id, key: endpointRef.key },
      { node: "c0", id: 300, key: KEY },
    );
    // Revisions order the three watches: the deletion comes after the endpoint and the Lease.
    const revs = changes.filter((c) => c.t !== "gap").map((c) => (c as { rev: number }).rev);
    assert.deepEqual(revs, [...revs].sort((a, b) => a - b));
    // What a watch delivers carries the instant that watch last delivered before it (here its
    // first list): the earliest it can have happened, never after it was seen.
    for (const c of changes) {
      if (c.t === "gap" || c.t === "lock") continue;
      assert.ok(c.early === undefined || c.early <= c.at, JSON.stringify(c));
    }
    assert.ok(deleted.early !== undefined, "the deletion, a watch event, carries its bound");

    // Judged: held by w0 under a live Lease and named by c0's endpoint (nobody's GC log: the
    // operator's, by elimination).
    const { violations } = checkDeletions({ changes, gcPasses: [], skewMs: 500 });
    assert.equal(violations.length, 1);
    const e = violations[0].evidence as { heldBy: string[]; namedBy: string[]; class: string };
    assert.deepEqual([e.heldBy, e.namedBy, e.class], [["w0"], ["c0"], "mixed (idalloc's)"]);

    writer.set("c0", KEY, undefined);
    await writer.flush(10_000);
    assert.equal(
      await client.get(endpointResource(identities), endpointName("c0", KEY), { namespace }),
      undefined,
    );
  },
);
