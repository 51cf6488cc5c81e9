/**
 * The Kubernetes API client against a real kube-apiserver (v1.20, etcd behind it): reads and
 * writes with their failure answers, list paging, watches (order, abort, 410). Each test works on
 * its own copy of Cilium's CiliumIdentity CRD (a fresh group) on the process's shared server.
 * Registered through tests/_support/test.ts: they run on Node.js too.
 */
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { KubeApiError } from "../../../src/backends/k8s/errors.ts";
import {
  createKubeClient,
  type KubeObject,
  type KubeWatchEvent,
} from "../../../src/backends/k8s/client.ts";
import {
  sharedKubeApiServer,
  startKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { test } from "../../_support/test.ts";
import { apiServerTests } from "./_client_support.ts";

const k8sTest = apiServerTests("client");

const LEASES = {
  group: "coordination.k8s.io",
  version: "v1",
  plural: "leases",
  namespaced: true,
  kind: "Lease",
} as const;

function identity(name: string, labels: Record<string, string> = { "k8s:app": name }): KubeObject {
  return { metadata: { name }, "security-labels": labels };
}

/** Collects a watch's events until `until` holds, then aborts it; the events. */
async function collect(
  events: AsyncIterable<KubeWatchEvent>,
  controller: AbortController,
  until: (seen: readonly KubeWatchEvent[]) => boolean,
): Promise<KubeWatchEvent[]> {
  const seen: KubeWatchEvent[] = [];
  for await (const event of events) {
    seen.push(event);
    if (until(seen)) controller.abort();
  }
  return seen;
}

k8sTest("create, get, update, delete; a taken name is 409 AlreadyExists", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  const created = await client.create(res, identity("100"));
  assert.equal(created.apiVersion, `${res.group}/v2`);
  assert.equal(created.kind, "CiliumIdentity");
  assert.deepEqual(created["security-labels"], { "k8s:app": "100" });
  assert.ok(created.metadata.resourceVersion);
  assert.ok(created.metadata.creationTimestamp);

  const taken = await client.create(res, identity("100", { "k8s:app": "other" })).catch((e) => e);
  assert.ok(taken instanceof KubeApiError);
  assert.equal(taken.code, 409);
  assert.equal(taken.reason, "AlreadyExists");
  assert.equal(taken.details?.name, "100");
  assert.equal(taken.retryable, false);

  const got = await client.get(res, "100");
  assert.deepEqual(got?.["security-labels"], { "k8s:app": "100" });
  assert.equal(await client.get(res, "101"), undefined);

  const updated = await client.update(res, { ...got!, "security-labels": { "k8s:app": "new" } });
  assert.notEqual(updated.metadata.resourceVersion, got!.metadata.resourceVersion);
  assert.equal(await client.delete(res, "100"), true);
  assert.equal(await client.delete(res, "100"), false);
  assert.equal(await client.get(res, "100"), undefined);
});

k8sTest("a stale resourceVersion: update and delete are refused with 409 Conflict", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  const v1 = await client.create(res, identity("200"));
  const v2 = await client.update(res, { ...v1, metadata: { ...v1.metadata, labels: { a: "b" } } });

  const stale = await client.update(res, v1).catch((e) => e);
  assert.ok(stale instanceof KubeApiError);
  assert.equal(stale.code, 409);
  assert.equal(stale.reason, "Conflict");

  const refused = await client.delete(res, "200", {
    resourceVersion: v1.metadata.resourceVersion,
  }).catch((e) => e);
  assert.ok(refused instanceof KubeApiError);
  assert.equal(refused.reason, "Conflict");
  assert.match(refused.message, /precondition/i);
  assert.ok(await client.get(res, "200"), "the object is still there");

  const wrongUid = await client.delete(res, "200", { uid: "not-its-uid" }).catch((e) => e);
  assert.ok(wrongUid instanceof KubeApiError);
  assert.equal(wrongUid.reason, "Conflict");

  assert.equal(
    await client.delete(res, "200", {
      resourceVersion: v2.metadata.resourceVersion,
      uid: v2.metadata.uid,
    }),
    true,
  );
});

k8sTest("merge patch: adds and removes annotations; stale version 409; missing 404", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  const created = await client.create(res, {
    metadata: { name: "300", annotations: { "io.cilium.heartbeat": "2026-01-01T00:00:00Z" } },
    "security-labels": { "k8s:app": "a" },
  });
  const patched = await client.patch(res, "300", {
    metadata: {
      resourceVersion: created.metadata.resourceVersion,
      annotations: { "ref.idalloc.io/n1": "5", "io.cilium.heartbeat": null },
    },
  }, { type: "merge" });
  assert.deepEqual(patched.metadata.annotations, { "ref.idalloc.io/n1": "5" });

  const stale = await client.patch(res, "300", {
    metadata: { resourceVersion: created.metadata.resourceVersion, annotations: { x: "1" } },
  }, { type: "merge" }).catch((e) => e);
  assert.ok(stale instanceof KubeApiError);
  assert.equal(stale.code, 409);
  assert.equal(stale.reason, "Conflict");

  const missing = await client.patch(res, "301", { metadata: { annotations: { x: "1" } } }, {
    type: "merge",
  }).catch((e) => e);
  assert.ok(missing instanceof KubeApiError);
  assert.equal(missing.code, 404);
  assert.equal(missing.reason, "NotFound");
});

k8sTest("JSON patch: a test op guards the write; a failed test is 422 Invalid", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  await client.create(res, identity("400", { "k8s:app": "a" }));
  const guarded = (labels: Record<string, string>) => [
    { op: "test", path: "/security-labels", value: labels },
    { op: "add", path: "/metadata/annotations", value: { "ref.idalloc.io/n1": "7" } },
  ];
  const ok = await client.patch(res, "400", guarded({ "k8s:app": "a" }), { type: "json" });
  assert.deepEqual(ok.metadata.annotations, { "ref.idalloc.io/n1": "7" });

  // What v1.20 answers to a failed `test` (recorded for the protocol): 422 Invalid, no causes.
  const failed = await client.patch(res, "400", guarded({ "k8s:app": "b" }), { type: "json" })
    .catch((e) => e);
  assert.ok(failed instanceof KubeApiError);
  assert.equal(failed.code, 422);
  assert.equal(failed.reason, "Invalid");
  assert.equal(failed.details?.causes, undefined);

  const missing = await client.patch(res, "401", guarded({ "k8s:app": "a" }), { type: "json" })
    .catch((e) => e);
  assert.ok(missing instanceof KubeApiError);
  assert.equal(missing.reason, "NotFound");
});

k8sTest("list pages with limit and continue; resourceVersion and label selectors", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  for (let i = 1; i <= 7; i++) {
    await client.create(res, {
      metadata: { name: String(i), labels: { parity: i % 2 ? "odd" : "even" } },
      "security-labels": { "k8s:i": String(i) },
    });
  }
  const names: string[] = [];
  let next: string | undefined;
  let pages = 0;
  do {
    const page = await client.list(res, { limit: 3, ...(next && { continue: next }) });
    assert.ok(page.resourceVersion !== "");
    names.push(...page.items.map((o) => o.metadata.name!));
    next = page.continue;
    pages++;
  } while (next !== undefined);
  assert.equal(pages, 3);
  assert.deepEqual(names.sort(), ["1", "2", "3", "4", "5", "6", "7"]);

  const odd = await client.list(res, { labelSelector: "parity=odd" });
  assert.deepEqual(odd.items.map((o) => o.metadata.name).sort(), ["1", "3", "5", "7"]);
  const cached = await client.list(res, { resourceVersion: "0" });
  assert.equal(cached.items.length, 7);
});

k8sTest("namespaced resources: the client's namespace, a named one, all namespaces", async () => {
  const cluster = await sharedKubeApiServer();
  await using client = await cluster.client("admin", "default");
  const ns = {
    group: "",
    version: "v1",
    plural: "namespaces",
    namespaced: false,
    kind: "Namespace",
  };
  const other = `t-${crypto.randomUUID().slice(0, 8)}`;
  await client.create(ns, { metadata: { name: other } });
  const name = `idalloc-node-${crypto.randomUUID().slice(0, 8)}`;
  const lease = (n: string) => ({
    metadata: { name: n, labels: { "idalloc.io/test": name } },
    spec: { holderIdentity: "n1", leaseDurationSeconds: 10 },
  });
  const here = await client.create(LEASES, lease(name));
  assert.equal(here.metadata.namespace, "default");
  const there = await client.create(LEASES, lease(name), { namespace: other });
  assert.equal(there.metadata.namespace, other);
  const all = await client.list(LEASES, {
    allNamespaces: true,
    labelSelector: `idalloc.io/test=${name}`,
  });
  assert.deepEqual(all.items.map((o) => o.metadata.namespace).sort(), ["default", other].sort());
  assert.equal(await client.delete(LEASES, name), true);
  assert.ok(await client.get(LEASES, name, { namespace: other }));
  assert.equal(await client.delete(ns, other), true);
});

k8sTest("watch from a list's version: every change in order; abort ends it", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  await client.create(res, identity("1"));
  const { resourceVersion } = await client.list(res);
  const controller = new AbortController();
  const watching = collect(
    client.watch(res, { resourceVersion, signal: controller.signal }),
    controller,
    (seen) => seen.filter((e) => e.type !== "BOOKMARK").length === 4,
  );
  await client.create(res, identity("2"));
  await client.patch(res, "2", { metadata: { annotations: { a: "b" } } }, { type: "merge" });
  await client.delete(res, "1");
  await client.create(res, identity("3"));
  const seen = (await watching).filter((e) => e.type !== "BOOKMARK");
  assert.deepEqual(seen.map((e) => `${e.type} ${e.object.metadata.name}`), [
    "ADDED 2",
    "MODIFIED 2",
    "DELETED 1",
    "ADDED 3",
  ]);
  const versions = seen.map((e) => Number(e.object.metadata.resourceVersion));
  assert.deepEqual(versions, [...versions].sort((a, b) => a - b));
  assert.ok(versions[0] > Number(resourceVersion));
});

k8sTest("a watch left early (break), or aborted while idle, closes its stream", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  await client.create(res, identity("1"));
  await client.create(res, identity("2"));
  // From "0": the server starts with the current objects as ADDED events.
  for await (const event of client.watch(res, { resourceVersion: "0" })) {
    assert.equal(event.type, "ADDED");
    break;
  }
  const controller = new AbortController();
  const { resourceVersion } = await client.list(res);
  const idle = (async () => {
    const seen = [];
    for await (const event of client.watch(res, { resourceVersion, signal: controller.signal })) {
      seen.push(event);
    }
    return seen;
  })();
  // Abort once the watch is known to be established: a write made after it is seen.
  const probe = new AbortController();
  const established = collect(
    client.watch(res, { resourceVersion, signal: probe.signal }),
    probe,
    () => true,
  );
  await client.create(res, identity("3"));
  await established;
  controller.abort();
  const seen = await idle;
  assert.ok(seen.length <= 1);
  // Aborted before it starts: ends at once.
  const none = [];
  for await (const event of client.watch(res, { resourceVersion, signal: controller.signal })) {
    none.push(event);
  }
  assert.deepEqual(none, []);
});

k8sTest("a call aborted in flight rejects with the signal's reason", async () => {
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  const reason = new Error("caller gave up");
  const controller = new AbortController();
  const pending = client.list(res, { signal: controller.signal });
  controller.abort(reason);
  await assert.rejects(pending, (err) => err === reason);
  await assert.rejects(
    client.get(res, "1", { signal: controller.signal }),
    (err) => err === reason,
  );
});

k8sTest("a watch from a version older than the watch cache throws 410 (expired)", async () => {
  const cluster = await sharedKubeApiServer();
  await using client = await cluster.client();
  // A version from before the CRD exists is older than anything its watch cache holds.
  const before = await client.list(LEASES, { limit: 1 });
  const res = await cluster.installIdentityCrd();
  await client.create(res, identity("1"));
  const err = await (async () => {
    for await (
      const _ of client.watch(res, { resourceVersion: String(Number(before.resourceVersion) - 1) })
    ) {
      // nothing: the server answers the watch with an ERROR event
    }
  })().catch((e) => e);
  assert.ok(err instanceof KubeApiError, String(err));
  assert.equal(err.code, 410);
  assert.ok(err.expired);
  assert.equal(err.reason, "Expired");
});

k8sTest(
  "watch cache off: etcd compaction expires a watch from an older version (410)",
  async () => {
    await using cluster = await startKubeApiServer({ ciliumCrds: false, watchCache: false });
    const res = await cluster.installIdentityCrd();
    await using client = await cluster.client();
    const first = await client.create(res, identity("1"));
    await client.create(res, identity("2"));
    const controller = new AbortController();
    const before = await collect(
      client.watch(res, {
        resourceVersion: first.metadata.resourceVersion!,
        signal: controller.signal,
      }),
      controller,
      (seen) => seen.length === 1,
    );
    assert.deepEqual(before.map((e) => `${e.type} ${e.object.metadata.name}`), ["ADDED 2"]);
    // etcd keeps the compaction revision itself: one more write puts "2" behind it.
    await client.create(res, identity("3"));
    await cluster.compact();
    const err = await (async () => {
      for await (
        const _ of client.watch(res, { resourceVersion: first.metadata.resourceVersion! })
      ) {
        // nothing: compacted
      }
    })().catch((e) => e);
    assert.ok(err instanceof KubeApiError, String(err));
    assert.ok(err.expired);
    // A paged list from the compacted version fails the same way.
    const list = await client.list(res, {
      resourceVersion: first.metadata.resourceVersion!,
      limit: 1,
    })
      .catch((e) => e);
    assert.ok(list instanceof KubeApiError && list.expired, String(list));
  },
);

// kube-apiserver v1.20 sends no BOOKMARK (its watch context has no deadline); the client asks for
// them and passes them on. This test serves a canned watch stream to show both.
test("k8s client: bookmarks are asked for and yielded (canned watch stream)", async () => {
  let query = "";
  const server = createServer((req, res) => {
    query = req.url ?? "";
    res.writeHead(200, { "content-type": "application/json" });
    res.write('{"type":"ADDED","object":{"metadata":{"name":"1","resourceVersion":"5"}}}\n');
    res.end('{"type":"BOOKMARK","object":{"kind":"X","metadata":{"resourceVersion":"9"}}}');
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  try {
    const port = (server.address() as AddressInfo).port;
    await using client = await createKubeClient({
      server: `http://127.0.0.1:${port}`,
      namespace: "default",
      source: "canned",
    });
    const res = {
      group: "cilium.io",
      version: "v2",
      plural: "ciliumidentities",
      namespaced: false,
    };
    const seen = [];
    for await (const e of client.watch(res, { resourceVersion: "4" })) seen.push(e);
    assert.deepEqual(seen.map((e) => `${e.type} ${e.object.metadata.resourceVersion}`), [
      "ADDED 5",
      "BOOKMARK 9",
    ]);
    assert.match(query, /[?&]allowWatchBookmarks=true/);
    assert.match(query, /[?&]resourceVersion=4/);
    assert.match(query, /[?&]watch=1/);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});
