// The Kubernetes nemesis harness through the faults it injects, on a private kube-apiserver: a
// snapshot asked while the API server is down waits for it instead of failing the harness (seeds
// 1 and 3 of the first mixed runs failed so), an API-server restart whose etcd compaction fails
// still brings the API server back, and the store's record keeps a node's reference to a key
// while it moves between two identities of the key. Skipped (loudly) where kube-apiserver is not
// built.
import assert from "node:assert/strict";
import { sleep } from "../../src/abort.ts";
import { endpointCrd } from "../../src/backends/k8s/testing/crds.ts";
import { injectK8sFault } from "../../src/backends/k8s/testing/nemesis_faults.ts";
import { recordK8sChanges } from "../../src/backends/k8s/testing/nemesis_cilium.ts";
import { K8sNemesisStore } from "../../src/backends/k8s/testing/nemesis_store.ts";
import { HarnessRetryError, untilServed } from "../../src/backends/k8s/testing/nemesis_retry.ts";
import {
  identityResource,
  type KubeTestCluster,
  startKubeApiServer,
} from "../../src/backends/k8s/testing/cluster.ts";
import type { KubeClient } from "../../src/backends/k8s/client.ts";
import {
  heldRemovalPatch,
  nodeRefsObject,
  readNodeRefs,
  refsName,
} from "../../src/backends/k8s/layout.ts";
import { LEASES } from "../../src/backends/k8s/options.ts";
import { StoreConnectionRefusedError } from "../../src/errors.ts";
import type { StoreChange } from "../../src/testing/store_changes.ts";
import { eventually, k8sTest, sharedCluster } from "../backends/k8s/_helpers.ts";

const NAMESPACE = "default";

/**
 * A nemesis store on `cluster` through an admin client; `owned`: the store's own API server (it
 * keeps it, and stops it when disposed), else only read.
 */
async function storeOn(
  cluster: KubeTestCluster,
  owned: boolean,
): Promise<{ store: K8sNemesisStore; client: KubeClient }> {
  const client = await cluster.client("admin", NAMESPACE);
  const spec = {
    kind: "k8s" as const,
    kubeconfig: await cluster.kubeconfig("admin", { namespace: NAMESPACE }),
    context: "nemesis",
    namespace: NAMESPACE,
    group: "cilium.io",
    maxClockSkewMs: 500,
    requestTimeoutMs: 3_000,
  };
  const store = owned
    ? new K8sNemesisStore(spec, client, cluster)
    : new K8sNemesisStore(spec, client);
  return { store, client };
}

k8sTest(
  "k8s harness: a snapshot and a fault's own restart ride out the API server being down",
  async () => {
    await using cluster = await startKubeApiServer();
    const { store, client } = await storeOn(cluster, false);
    try {
      // Asked while nothing listens: the harness's call waits for the restart (it failed at once,
      // StoreConnectionRefusedError, before).
      await cluster.kill();
      const snapshot = store.snapshot().then((s) => s, (err: unknown) => err);
      await sleep(1_500);
      await cluster.restart();
      const taken = await snapshot;
      assert.ok(!(taken instanceof Error), String(taken));
      assert.deepEqual((taken as { masters: unknown[] }).masters, []);

      // An API-server restart whose compaction fails (a 5 s timeout on a loaded machine): the fault
      // still starts it again and says what failed (it left the API server down for the rest of
      // the run, before). `random` < 0.5 asks for the compaction.
      const failing = new Proxy(cluster, {
        get(target, prop) {
          if (prop === "compact") return () => Promise.reject(new Error("compaction timed out"));
          const value = Reflect.get(target, prop, target);
          return typeof value === "function" ? value.bind(target) : value;
        },
      });
      const outcome = await injectK8sFault(
        { cluster: failing, client, identities: identityResource("cilium.io") },
        "apiserver-restart",
        () => 0.1,
      );
      assert.match(
        outcome.detail,
        /etcd's compaction failed meanwhile \(Error: compaction timed out\)/,
      );
      assert.ok(outcome.backAt !== undefined);
      assert.deepEqual((await store.snapshot()).masters, []);
    } finally {
      await store[Symbol.asyncDispose]();
    }
  },
);

Deno.test("k8s harness: a call still refused after its bound fails with HarnessRetryError", async () => {
  let attempts = 0;
  const err = await untilServed("list identities", () => {
    attempts++;
    return Promise.reject(new StoreConnectionRefusedError("https://127.0.0.1:1 refused"));
  }, 1_200).catch((e) => e);
  assert.ok(err instanceof HarnessRetryError, String(err));
  assert.equal(err.attempts, attempts);
  assert.ok(attempts >= 2 && attempts <= 4, `${attempts} attempts`);
  assert.ok(err.cause instanceof StoreConnectionRefusedError);
});

/**
 * A fresh identity resource (and its endpoints, which the record lists too) on the shared server,
 * an admin client of it and the store's record of it, stopped on dispose.
 */
async function recording() {
  const cluster = await sharedCluster();
  const identities = await cluster.installIdentityCrd();
  await cluster.installCrd(endpointCrd(identities.group));
  const client = await cluster.client("admin", NAMESPACE);
  const changes: StoreChange[] = [];
  const recorder = await recordK8sChanges(
    { client, identities, namespace: NAMESPACE },
    (c) => changes.push(c),
  );
  return {
    client,
    identities,
    changes,
    async [Symbol.asyncDispose]() {
      await recorder[Symbol.asyncDispose]();
      await client[Symbol.asyncDispose]();
    },
  };
}

k8sTest(
  "k8s record: a node moving from its duplicate to the key's older identity keeps its reference",
  async () => {
    // w0 creates 401 for K, then joins the older 400 and drops its reference from 401 (what an
    // idalloc node does when its create raced a Cilium agent's). Recorded per identity, the drop
    // read as w0 letting go of K while it held 400 (seed 1's `k8s:app=k71;`).
    const key = "k8s:app=k9;";
    await using rec = await recording();
    const { client, identities, changes } = rec;
    const create = (id: number, refs: Record<string, string>) =>
      client.create(identities, {
        apiVersion: `${identities.group}/v2`,
        metadata: { name: String(id), annotations: refs },
        "security-labels": { "k8s:app": "k9" },
      });
    const refPatch = (id: number, epoch: string | null) =>
      client.patch(identities, String(id), {
        metadata: { annotations: { "ref.idalloc.io/w0": epoch } },
      }, { type: "merge" });
    try {
      await create(400, {});
      await create(401, { "ref.idalloc.io/w0": "e1" });
      await refPatch(400, "e1");
      await refPatch(401, null);
      await refPatch(400, null);
      const refs = () =>
        changes.filter((c): c is Extract<StoreChange, { t: "ref" }> =>
          c.t === "ref" && c.key === key
        );
      await eventually(() => refs().length >= 3, "w0's references recorded");
      await sleep(300);
      assert.deepEqual(refs().map((r) => r.id), [401, 400, null]);
      const masters = changes.filter((c): c is Extract<StoreChange, { t: "master" }> =>
        c.t === "master" && c.key === key
      );
      assert.deepEqual(masters.map((m) => m.id), [400, 401]);
      for (const m of masters) {
        assert.ok(m.created !== undefined && Math.abs(m.created - Date.now()) < 120_000);
      }
    } finally {
      await client.delete(identities, "400");
      await client.delete(identities, "401");
    }
  },
);

k8sTest(
  "k8s record: a node's reference object is its references, written before or after the identity, and in a deleted identity's last state",
  async () => {
    // Nodes keep their references in their own objects (`idalloc-refs-<node>`), not on the
    // identity: a record that read only annotations would see no idalloc node holding anything,
    // and the deletions check could never find a held identity deleted.
    const key = "k8s:app=k10;";
    await using rec = await recording();
    const { client, identities, changes } = rec;
    const refs = () =>
      changes.filter((c): c is Extract<StoreChange, { t: "ref" }> =>
        c.t === "ref" && c.key === key
      );
    const drop = async (id: number) => {
      const obj = await client.get(LEASES, refsName("w1"), { namespace: NAMESPACE });
      const annotations = heldRemovalPatch(readNodeRefs(obj!)!, { ids: new Set([id]) });
      await client.patch(LEASES, refsName("w1"), { metadata: { annotations } }, {
        type: "merge",
        namespace: NAMESPACE,
      });
    };
    try {
      // The reference goes out beside the create, so it may land first.
      await client.create(LEASES, nodeRefsObject("w1", new Map([[410, "e1"]])), {
        namespace: NAMESPACE,
      });
      await sleep(300);
      await client.create(identities, {
        apiVersion: `${identities.group}/v2`,
        metadata: { name: "410" },
        "security-labels": { "k8s:app": "k10" },
      });
      await eventually(() => refs().length >= 1, "w1's reference recorded");
      assert.deepEqual(refs().map((r) => [r.node, r.id]), [["w1", 410]]);
      await client.delete(identities, "410");
      const deleted = () =>
        changes.find((c): c is Extract<StoreChange, { t: "deleted" }> =>
          c.t === "deleted" && c.id === 410
        );
      await eventually(() => deleted() !== undefined, "the deletion recorded");
      assert.deepEqual(deleted()!.refs, { w1: "e1" });
      // Created again, then let go of by its node: the object's change is the drop.
      await client.create(identities, {
        apiVersion: `${identities.group}/v2`,
        metadata: { name: "410" },
        "security-labels": { "k8s:app": "k10" },
      });
      await eventually(() => refs().length >= 3, "the reference again");
      await drop(410);
      await eventually(() => refs().length >= 4, "the drop recorded");
      assert.deepEqual(refs().map((r) => r.id), [410, null, 410, null]);
    } finally {
      await client.delete(identities, "410").catch(() => {});
      await client.delete(LEASES, refsName("w1"), { namespace: NAMESPACE }).catch(() => {});
    }
  },
);

k8sTest(
  "k8s harness: the store's keeper starts its API server again when it dies outside a fault",
  async () => {
    // Three runs lost their API server for good a while in, with no fault restarting it: the keeper
    // is what brings it back then.
    const cluster = await startKubeApiServer();
    const { store } = await storeOn(cluster, true);
    try {
      Deno.kill(cluster.pid!, "SIGKILL");
      await eventually(() => store.revived.length > 0, "the keeper's revival", 240_000);
      assert.match(store.revived[0], /gone outside any fault; started again/);
      assert.deepEqual((await store.snapshot()).masters, []);
    } finally {
      await store[Symbol.asyncDispose]();
    }
  },
);
