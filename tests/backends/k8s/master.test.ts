// The identity-create step (src/backends/k8s/master.ts), the one place an idalloc node creates an
// identity, on the real API server: the object carries the key and this node's reference; a second
// create under the same ID answers "taken" (no throw) and changes nothing. (A key the server's
// validation refuses: session.test.ts, through acquire.) A create that landed but whose answer
// was lost is reported new once, by the allocation's retry. The look before a create where the
// informer lags: a consistent read of the identities carrying a key, selected by its labels.
import assert from "node:assert/strict";
import { Allocator } from "../../../src/allocator/allocator.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import type { KubeClient } from "../../../src/backends/k8s/client.ts";
import {
  readIdentity,
  sanitizedLabels,
  securityLabelsOf,
} from "../../../src/backends/k8s/layout.ts";
import {
  createMaster,
  identitiesOfKey,
  keySelector,
  type MasterTarget,
} from "../../../src/backends/k8s/master.ts";
import { StoreUnavailableError } from "../../../src/errors.ts";
import { deadline, fixture, k8sTest } from "./_helpers.ts";

/**
 * `client`, whose next `lose.count` identity creates reach the API server and are applied, and
 * then fail as a broken connection would: the answer is lost.
 */
function losingCreates(client: KubeClient, lose: { count: number }): KubeClient {
  return new Proxy(client, {
    get(target, prop) {
      if (prop === "create") {
        return async (...args: Parameters<KubeClient["create"]>) => {
          const made = await target.create(...args);
          if (args[0].plural === "ciliumidentities" && lose.count-- > 0) {
            throw new StoreUnavailableError("connection reset by peer (the answer is lost)");
          }
          return made;
        };
      }
      const value = Reflect.get(target, prop, target);
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

k8sTest(
  "createMaster creates the identity recording its creator (no reference: that is the node's own object); a taken ID answers undefined",
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
    assert.deepEqual([...read.record.refs], []);
    assert.equal(
      (await fx.identity(300))!.metadata.annotations?.["idalloc.io/creator"],
      "node-a/e1",
    );
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

k8sTest("a create whose answer was lost is reported new once, by the retry", async () => {
  await using fx = await fixture();
  const lose = { count: 0 };
  await using backend = await K8sBackend.connect(fx.options("a"), {
    client: losingCreates(fx.client, lose),
  });
  await using a = await Allocator.open(backend, { min: 256, max: 65535, leaseTtlMs: 3_000 });
  await a.waitForInitialSync();
  lose.count = 1;
  const first = await a.allocate("k8s:app=lost;");
  assert.equal(lose.count, 0, "the create's answer was lost");
  assert.deepEqual(first, { id: first.id, isNew: true, firstUse: true });
  const records = await fx.records();
  assert.deepEqual(records.map((r) => [r.id, r.key]), [[first.id, "k8s:app=lost;"]]);

  // Nobody else reports it new.
  const b = await fx.allocator("b");
  assert.deepEqual(await b.allocate("k8s:app=lost;"), {
    id: first.id,
    isNew: false,
    firstUse: true,
  });
});

Deno.test("keySelector: the key's k8s: labels as the identity's metadata.labels carry them", () => {
  assert.equal(keySelector("k8s:app=web;k8s:tier=db;unspec:x=1;"), "app=web,tier=db");
  // An empty value is left out: fewer labels still select every identity of the key.
  assert.equal(keySelector("k8s:app=web;k8s:canary=;"), "app=web");
  // No selectable label (a reserved label, a key that is no label set): every identity is listed.
  assert.equal(keySelector("reserved:host=;"), undefined);
  assert.equal(keySelector("plain key"), undefined);
});

k8sTest(
  "identitiesOfKey reads the store (not the informer) and keeps only identities carrying the key",
  async () => {
    await using fx = await fixture();
    const create = (id: number, key: string, labels?: Record<string, string>) =>
      fx.client.create(fx.identities, {
        apiVersion: `${fx.group}/v2`,
        kind: "CiliumIdentity",
        metadata: { name: String(id), labels: labels ?? sanitizedLabels(securityLabelsOf(key)) },
        "security-labels": securityLabelsOf(key),
      }, { signal: deadline() });
    await create(300, "k8s:app=k39;");
    await create(301, "k8s:app=k39;"); // Cilium's agents make duplicates: both are returned.
    await create(302, "k8s:app=k39;k8s:tier=db;"); // Selected by app=k39, another key.
    await create(303, "plain key");
    await create(304, "other key");
    const ids = async (key: string) =>
      (await identitiesOfKey(fx.client, fx, key, deadline()))
        .map((obj) => Number(obj.metadata.name)).sort();
    assert.deepEqual(await ids("k8s:app=k39;"), [300, 301]);
    assert.deepEqual(await ids("plain key"), [303]);
    assert.deepEqual(await ids("k8s:app=none;"), []);
  },
);
