// The Kubernetes backend's options: defaults, the node name rule (an annotation name part), the
// resource and namespace shapes, and the lease TTL against the skew and the heartbeat timeout.
import assert from "node:assert/strict";
import {
  checkLeaseTtl,
  endpointResource,
  identityResource,
  resolveK8sOptions,
} from "../../../src/backends/k8s/options.ts";

Deno.test("defaults: Cilium's resource, its endpoints, its heartbeat timeout", () => {
  const s = resolveK8sOptions({ node: "10.0.0.1" });
  assert.deepEqual(identityResource(s), {
    group: "cilium.io",
    version: "v2",
    plural: "ciliumidentities",
    namespaced: false,
  });
  assert.deepEqual(endpointResource(s), {
    group: "cilium.io",
    version: "v2",
    plural: "ciliumendpoints",
    namespaced: true,
  });
  assert.equal(s.resource.kind, "CiliumIdentity");
  assert.equal(s.heartbeatTimeoutMs, 1_800_000);
  assert.equal(s.namespace, "idalloc-system", "the store's, never the context's");
  const custom = resolveK8sOptions({
    node: "n",
    resource: { group: "ids.example.org" },
    endpoints: false,
  });
  assert.equal(identityResource(custom).group, "ids.example.org");
  assert.equal(endpointResource(custom), undefined);
});

Deno.test("node names must be annotation name parts", () => {
  for (const node of ["a", "node-1", "10.0.0.1", "A_b.c", "x".repeat(63)]) {
    resolveK8sOptions({ node });
  }
  for (const node of ["", "a/b", "-a", "a.", "x".repeat(64), "ä"]) {
    assert.throws(() => resolveK8sOptions({ node }), { name: "InvalidOptionsError" }, node);
  }
});

Deno.test("namespace, resource and connection options are checked", () => {
  const bad = [
    { node: "n", namespace: "Kube_System" },
    { node: "n", resource: { group: "Cilium.io" } },
    { node: "n", resource: { kind: "ciliumIdentity" } },
    { node: "n", inCluster: true, kubeconfig: "x" },
    { node: "n", heartbeatTimeoutMs: 10 },
    { node: "n", extra: 1 },
  ];
  for (const o of bad) {
    assert.throws(
      () => resolveK8sOptions(o as Parameters<typeof resolveK8sOptions>[0]),
      { name: "InvalidOptionsError" },
      JSON.stringify(o),
    );
  }
});

Deno.test("the lease TTL leaves room for the skew and renews within the heartbeat timeout", () => {
  const s = resolveK8sOptions({ node: "n", maxClockSkewMs: 1_000, heartbeatTimeoutMs: 60_000 });
  checkLeaseTtl(s, 15_000);
  assert.throws(() => checkLeaseTtl(s, 1_500), /2 × maxClockSkewMs/);
  assert.throws(() => checkLeaseTtl(s, 60_000), /heartbeatTimeoutMs/);
});
