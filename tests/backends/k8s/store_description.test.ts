// How `--store k8s:…`, `--prefix` and the backend's own flags describe a Kubernetes store.
import assert from "node:assert/strict";
import { resolve } from "node:path";
import { k8sDriver } from "../../../src/backends/k8s/driver.ts";
import { describeK8sStore, k8sResource } from "../../../src/backends/k8s/store_description.ts";

const CONTEXT = { timeoutMs: 30_000, leaseTtlMs: 60_000 };

Deno.test("a kubeconfig path, kubectl's default, or in-cluster", () => {
  const d = describeK8sStore("conf/kube.yaml", { context: "dev" }, CONTEXT);
  assert.equal(d.kubeconfig, resolve("conf/kube.yaml"));
  assert.equal(d.inCluster, false);
  assert.equal(d.context, "dev");
  assert.deepEqual([d.connectTimeoutMs, d.requestTimeoutMs], [5_000, 30_000]);
  assert.equal(describeK8sStore("", {}, CONTEXT).kubeconfig, undefined, "found when opened");
  const inCluster = describeK8sStore("in-cluster", {}, CONTEXT);
  assert.deepEqual([inCluster.inCluster, inCluster.kubeconfig], [true, undefined]);
  assert.deepEqual([inCluster.connectTimeoutMs, inCluster.requestTimeoutMs], [5_000, 30_000]);
  assert.throws(() => describeK8sStore("in-cluster", { context: "dev" }, CONTEXT), {
    name: "InvalidOptionsError",
  });
  k8sDriver.description.parse(d);
});

Deno.test("--prefix names the identity resource; the flags are checked", () => {
  const d = describeK8sStore("k", { namespace: "kube-system", kind: "Identity" }, {
    ...CONTEXT,
    prefix: "identities.ids.example.org/v1",
  });
  assert.deepEqual(d.resource, {
    group: "ids.example.org",
    version: "v1",
    plural: "identities",
    kind: "Identity",
  });
  assert.equal(d.namespace, "kube-system");
  assert.equal(k8sResource("ciliumidentities.cilium.io"), undefined, "the version is required");
  assert.throws(() => describeK8sStore("k", {}, { ...CONTEXT, prefix: "a/b" }), /--prefix/);
  assert.throws(() => describeK8sStore("k", { namespace: "Bad_NS" }, CONTEXT), /--namespace/);
  assert.throws(
    () => describeK8sStore("k", { heartbeatTimeout: "soon" }, CONTEXT),
    /--heartbeat-timeout/,
  );
  assert.throws(() => describeK8sStore("k", { kind: "lower" }, CONTEXT), /--kind/);
});

Deno.test("--clock-skew (shared with Deno KV) sets the margin; the lease TTL must be twice it", () => {
  assert.equal(describeK8sStore("k", {}, CONTEXT).maxClockSkewMs, 5_000);
  const short = { ...CONTEXT, leaseTtlMs: 2_000 };
  assert.equal(describeK8sStore("k", { clockSkew: "250ms" }, short).maxClockSkewMs, 250);
  assert.throws(
    () => describeK8sStore("k", {}, short),
    /--lease-ttl \(2s\) must be at least twice --clock-skew \(5s\)/,
  );
  assert.throws(() => describeK8sStore("k", { clockSkew: "x" }, CONTEXT), /--clock-skew/);
  assert.ok(k8sDriver.options.some((o) => o.flags === "--clock-skew <duration>"));
});

Deno.test("the CLI's hints for Kubernetes failures name kubeconfig things, not etcd flags", () => {
  for (const name of ["StoreAccessDeniedError", "StoreTlsError", "StoreConnectionRefusedError"]) {
    const hint = k8sDriver.failures?.[name]?.hint?.(new Error("x")) ?? "";
    assert.match(hint, /kubeconfig/, name);
    assert.doesNotMatch(hint, /--user|--password|2379/, name);
  }
  assert.equal(k8sDriver.failures?.StoreHostNotFoundError?.kind, "unavailable");
});

Deno.test("--gc-grace: the store's grace for new or freshly marked identities, --heartbeat-timeout's by default", () => {
  assert.equal(describeK8sStore("", {}, CONTEXT).gcGraceMs, undefined, "the heartbeat timeout");
  assert.equal(describeK8sStore("", { gcGrace: "0s" }, CONTEXT).gcGraceMs, 0);
  assert.equal(describeK8sStore("", { gcGrace: "10m" }, CONTEXT).gcGraceMs, 600_000);
  assert.throws(() => describeK8sStore("", { gcGrace: "soon" }, CONTEXT), /--gc-grace/);
  k8sDriver.description.parse(describeK8sStore("", { gcGrace: "0s" }, CONTEXT));
});
