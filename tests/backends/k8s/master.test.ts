// The identity-create step (src/backends/k8s/master.ts), the one place an idalloc node creates an
// identity, on the real API server: the object carries the key and this node's reference; a second
// create under the same ID answers "taken" (no throw) and changes nothing. (A key the server's
// validation refuses: session.test.ts, through acquire.)
import assert from "node:assert/strict";
import { readIdentity } from "../../../src/backends/k8s/layout.ts";
import { createMaster, type MasterTarget } from "../../../src/backends/k8s/master.ts";
import { deadline, fixture, k8sTest } from "./_helpers.ts";

k8sTest(
  "createMaster creates the identity with the reference; a taken ID answers undefined",
  async () => {
    await using fx = await fixture();
    const target: MasterTarget = {
      identities: fx.identities,
      identityKind: { apiVersion: `${fx.group}/v2`, kind: "CiliumIdentity" },
      node: "node-a",
    };
    const key = "k8s:app=web;";
    const made = await createMaster(fx.client, target, { id: 300, key, epoch: "e1" }, deadline());
    assert.ok(made !== undefined);
    const read = readIdentity((await fx.identity(300))!);
    assert.ok(read.ok);
    assert.equal(read.record.key, key);
    assert.deepEqual([...read.record.refs], [["node-a", "e1"]]);
    assert.equal(read.record.rv, String(made.metadata.resourceVersion));

    const again = { id: 300, key: "k8s:app=db;", epoch: "e1" };
    assert.equal(
      await createMaster(fx.client, { ...target, node: "node-b" }, again, deadline()),
      undefined,
    );
    const still = readIdentity((await fx.identity(300))!);
    assert.ok(still.ok);
    assert.equal(still.record.key, key, "the first create stays");
  },
);
