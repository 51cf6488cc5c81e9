/**
 * The test API server itself: our CRD manifests match Cilium's generated ones (where a Cilium
 * build left them), a private server starts, survives a restart on its port, serves a fresh-group
 * identity CRD, and leaves no process or dir behind when closed.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { parse } from "../../../src/deps/yaml.ts";
import { alive } from "../../../src/testing/process_alive.ts";
import { CILIUM_CRD_DIR, startKubeApiServer } from "../../../src/backends/k8s/testing/cluster.ts";
import {
  type CrdManifest,
  endpointCrd,
  identityCrd,
} from "../../../src/backends/k8s/testing/crds.ts";
import { test } from "../../_support/test.ts";
import { skipApiServer } from "./_client_support.ts";

/** Cilium's YAML with the descriptions (which ours leave out) removed, at every depth. */
function withoutDescriptions(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(withoutDescriptions);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(
    Object.entries(value).filter(([k]) => k !== "description").map((
      [k, v],
    ) => [k, withoutDescriptions(v)]),
  );
}

/** Every path of `ours`' schema must be in Cilium's with the same type and format. */
function assertSubschema(ours: unknown, theirs: unknown, path: string): void {
  if (ours === null || typeof ours !== "object") {
    assert.deepEqual(theirs, ours, path);
    return;
  }
  assert.ok(theirs !== null && typeof theirs === "object", `${path} is missing in Cilium's CRD`);
  for (const [key, value] of Object.entries(ours)) {
    // Ours keeps Cilium's other status fields as given rather than describing each.
    if (key === "x-kubernetes-preserve-unknown-fields") continue;
    assertSubschema(value, (theirs as Record<string, unknown>)[key], `${path}.${key}`);
  }
}

const cilium = (name: string) => join(CILIUM_CRD_DIR, name);
for (
  const [file, ours] of [
    ["ciliumidentities.yaml", identityCrd()],
    ["ciliumendpoints.yaml", endpointCrd()],
  ] as [string, CrdManifest][]
) {
  test({
    name: `k8s testing: our ${file.replace(".yaml", "")} CRD has Cilium's names, scope and fields`,
    ignore: !existsSync(cilium(file)),
    async fn() {
      const theirs = withoutDescriptions(
        parse(await readFile(cilium(file), "utf8")),
      ) as CrdManifest;
      assert.equal(ours.metadata.name, theirs.metadata.name);
      assert.equal(ours.spec.group, theirs.spec.group);
      assert.equal(ours.spec.scope, theirs.spec.scope);
      assert.deepEqual(ours.spec.names, theirs.spec.names);
      const [v] = ours.spec.versions;
      const [tv] = theirs.spec.versions;
      assert.equal(theirs.spec.versions.length, 1);
      assert.deepEqual([v.name, v.served, v.storage], [tv.name, tv.served, tv.storage]);
      assert.deepEqual(v.subresources, tv.subresources);
      assertSubschema(v.schema.openAPIV3Schema, tv.schema.openAPIV3Schema, "schema");
      if (file === "ciliumidentities.yaml") {
        // The identity CRD is copied whole: nothing of Cilium's is left out.
        assertSubschema(tv.schema.openAPIV3Schema, v.schema.openAPIV3Schema, "cilium schema");
      }
    },
  });
}

test({
  name: "k8s testing: a private API server starts, restarts on its port, and is gone after close",
  ignore: skipApiServer,
  async fn() {
    const cluster = await startKubeApiServer();
    let closed = false;
    try {
      const pid = cluster.pid!;
      const etcdPort = new URL(cluster.etcd.endpoints[0]).port;
      console.log(
        `kube-apiserver: started in ${Math.round(cluster.startMs)} ms (etcd included), ` +
          `RSS ${Math.round(cluster.rssKiB() / 1024)} MiB`,
      );
      const res = await cluster.installIdentityCrd();
      assert.match(res.group, /^t[0-9a-f]{12}\.idalloc\.test$/);
      {
        await using client = await cluster.client();
        await client.create(res, { metadata: { name: "1" }, "security-labels": { "k8s:a": "b" } });
      }
      await cluster.kill();
      assert.equal(cluster.pid, undefined);
      assert.equal(alive(pid), false);
      await cluster.restart();
      {
        await using client = await cluster.client();
        assert.ok(await client.get(res, "1"), "the object survived the restart (it lives in etcd)");
      }
      const newPid = cluster.pid!;
      await cluster.close();
      closed = true;
      assert.equal(alive(newPid), false);
      assert.equal(existsSync(cluster.dir), false);
      assert.equal(
        await fetch(`http://127.0.0.1:${etcdPort}/health`).then(async (r) => {
          await r.body?.cancel();
          return "answered";
        }, () => "gone"),
        "gone",
      );
    } finally {
      if (!closed) await cluster.close();
    }
  },
});
