/**
 * The fixtures' CRD group pool (`src/backends/k8s/testing/crd_pool.ts`) on the real API server: a
 * released group comes back empty — no identity, no endpoint in any namespace, no slice — with its
 * CRDs as installed; of two fixtures racing for one free group one gets it; a group whose CRD was
 * changed, or one taken without a pool, has its CRDs deleted instead.
 */
import assert from "node:assert/strict";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { listAll } from "../../../src/backends/k8s/paging.ts";
import { pooledGroups, takeFixtureGroup } from "../../../src/backends/k8s/testing/crd_pool.ts";
import { CRD_RESOURCE, NAMESPACE_RESOURCE } from "../../../src/backends/k8s/testing/crds.ts";
import { k8sTest, sharedCluster } from "./_helpers.ts";

const signal = () => AbortSignal.timeout(30_000);

function withPool<T>(fn: (pool: string) => Promise<T>): Promise<T> {
  const pool = mkdtempSync(join(tmpdir(), "crd-pool-"));
  return fn(pool).finally(() => rmSync(pool, { recursive: true, force: true }));
}

k8sTest("crd pool: a released group comes back empty, with its CRDs as installed", async () => {
  const cluster = await sharedCluster();
  await using client = await cluster.client("admin");
  await withPool(async (pool) => {
    const first = await takeFixtureGroup(cluster, { pool });
    const ns = `pool-${crypto.randomUUID().slice(0, 8)}`;
    await client.create(NAMESPACE_RESOURCE, {
      apiVersion: "v1",
      kind: "Namespace",
      metadata: { name: ns },
    }, { signal: signal() });
    for (const id of [301, 302]) {
      await client.create(first.identities, {
        apiVersion: `${first.group}/v2`,
        kind: "CiliumIdentity",
        metadata: { name: String(id) },
        "security-labels": { "k8s:app": `a${id}` },
      }, { signal: signal() });
    }
    // Endpoints in two namespaces: the next fixture's GC reads every namespace's.
    for (const namespace of [ns, "default"]) {
      await client.create(first.endpoints, {
        apiVersion: `${first.group}/v2`,
        kind: "CiliumEndpoint",
        metadata: { name: "pod-1" },
        status: { id: 1, identity: { id: 301, labels: [] }, state: "ready" },
      }, { namespace, signal: signal() });
    }
    const slices = await first.endpointSlices();
    await client.create(slices, {
      apiVersion: `${first.group}/v2alpha1`,
      kind: "CiliumEndpointSlice",
      metadata: { name: "ces-1" },
      namespace: ns,
      endpoints: [{
        name: "pod-1",
        id: 302,
        networking: { addressing: [{ ipv4: "10.0.0.1" }], node: "192.168.0.1" },
      }],
    }, { signal: signal() });
    await first.release(client);
    assert.deepEqual(pooledGroups(pool), [first.group]);

    const again = await takeFixtureGroup(cluster, { pool });
    assert.equal(again.group, first.group, "the free group is taken again");
    assert.deepEqual(pooledGroups(pool), []);
    for (const resource of [again.identities, again.endpoints, slices]) {
      const { items } = await listAll(client, resource, { signal: signal(), allNamespaces: true });
      assert.deepEqual(items.map((o) => o.metadata.name), [], `${resource.plural} emptied`);
    }
    await again.release(client);
    await client.delete(NAMESPACE_RESOURCE, ns, { signal: signal() });
    await deleteCrds(client, first.group);
  });
});

k8sTest("crd pool: of two fixtures racing for one free group, one gets it", async () => {
  const cluster = await sharedCluster();
  await using client = await cluster.client("admin");
  await withPool(async (pool) => {
    const first = await takeFixtureGroup(cluster, { pool });
    await first.release(client);
    const [a, b] = await Promise.all([
      takeFixtureGroup(cluster, { pool }),
      takeFixtureGroup(cluster, { pool }),
    ]);
    assert.notEqual(a.group, b.group);
    assert.ok([a.group, b.group].includes(first.group));
    assert.equal(readdirSync(pool).filter((f) => f.endsWith(".taken")).length, 2);
    await Promise.all([a.release(client), b.release(client)]);
    assert.deepEqual(pooledGroups(pool).sort(), [a.group, b.group].sort());
    for (const group of [a.group, b.group]) await deleteCrds(client, group);
  });
});

k8sTest("crd pool: a changed CRD, or a group without a pool, is deleted, not kept", async () => {
  const cluster = await sharedCluster();
  await using client = await cluster.client("admin");
  await withPool(async (pool) => {
    const changed = await takeFixtureGroup(cluster, { pool });
    const name = `ciliumidentities.${changed.group}`;
    // A test that edits its CRD (a new short name: generation 2) leaves a group that is not fresh.
    await client.patch(CRD_RESOURCE, name, { spec: { names: { shortNames: ["cid"] } } }, {
      type: "merge",
      signal: signal(),
    });
    await changed.release(client);
    assert.deepEqual(pooledGroups(pool), []);
    assert.deepEqual(readdirSync(pool), [], "its taken file is gone too");
    await gone(client, name);

    const own = await takeFixtureGroup(cluster, { pool: undefined });
    await own.release(client);
    await gone(client, `ciliumidentities.${own.group}`);
    await gone(client, `ciliumendpoints.${own.group}`);
  });
});

/** Waits until CRD `name` is gone (a CRD's deletion waits for its objects to go). */
async function gone(client: Parameters<typeof deleteCrds>[0], name: string): Promise<void> {
  const end = Date.now() + 30_000;
  while ((await client.get(CRD_RESOURCE, name, { signal: signal() })) !== undefined) {
    assert.ok(Date.now() < end, `CRD ${name} still there after 30 s`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function deleteCrds(
  client: Awaited<ReturnType<Awaited<ReturnType<typeof sharedCluster>>["client"]>>,
  group: string,
): Promise<void> {
  for (const plural of ["ciliumidentities", "ciliumendpoints", "ciliumendpointslices"]) {
    await client.delete(CRD_RESOURCE, `${plural}.${group}`, { signal: signal() });
  }
}
