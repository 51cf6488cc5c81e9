// The damage report's judgement on plain data: a snapshot of identities, node Leases and claims
// in, findings out — a duplicate held by a live node (its reference under the Lease's epoch) is
// marked held, a stale claim and a Lease without an epoch are found, another resource's claim is
// not this store's business; a stale claim only once quiet, not one naming a damaged identity
// (removed with it); a reference without an epoch held by its live node; an oversized key; a
// duplicate a CiliumEndpoint or a CiliumEndpointSlice names, or created within Cilium's heartbeat
// timeout, is held by GC's own rule. On the real API server, through the CLI: `doctor` shows who
// uses each duplicate, `doctor --fix` removes only the unused one.
import assert from "node:assert/strict";
import { decodeToken } from "../../../src/allocator/damage.ts";
import { claimQuietMs } from "../../../src/backends/k8s/claim.ts";
import { judgeDamage } from "../../../src/backends/k8s/doctor.ts";
import { MAX_KEY_BYTES } from "../../../src/backends/k8s/limits.ts";
import { claimName, nodeLeaseObject } from "../../../src/backends/k8s/layout.ts";
import { resolveK8sOptions } from "../../../src/backends/k8s/options.ts";
import { cli } from "../../cli/_run.ts";
import { fixture, k8sTest } from "./_helpers.ts";

const NOW = Date.UTC(2026, 0, 1);
const ctx = {
  resourceName: "ciliumidentities.cilium.io",
  namespace: "ids",
  settings: resolveK8sOptions({ node: "doctor", now: () => NOW, maxClockSkewMs: 0 }),
};
const identity = (id: number, key: string, created: string, refs: Record<string, string> = {}) => ({
  metadata: {
    name: String(id),
    resourceVersion: `${id}0`,
    creationTimestamp: created,
    annotations: Object.fromEntries(
      Object.entries(refs).map(([node, epoch]) => [`ref.idalloc.io/${node}`, epoch]),
    ),
  },
  "security-labels": { "idalloc:key": key },
});
const claim = (resource: string, key: string, id: number) => ({
  metadata: {
    name: claimName(resource, key),
    resourceVersion: "1",
    labels: { "idalloc.io/id": String(id) },
    annotations: { "idalloc.io/key": key },
  },
});

Deno.test("findings of a snapshot: held duplicates, stale claims, Leases without an epoch", () => {
  const live = nodeLeaseObject("a", "e1", 60, NOW, NOW);
  const noEpoch = nodeLeaseObject("b", "x", 60, NOW, NOW);
  delete noEpoch.metadata.annotations;
  const findings = judgeDamage(ctx, {
    identities: [
      identity(300, "k;", "2025-01-01T00:00:00Z"),
      identity(301, "k;", "2025-01-01T00:00:01Z", { a: "e1" }),
      identity(302, "j;", "2025-01-01T00:00:00Z", { a: "e0" }),
    ],
    nodeLeases: [live, noEpoch],
    claims: [
      claim(ctx.resourceName, "k;", 300),
      claim(ctx.resourceName, "gone;", 400),
      claim("ciliumidentities.example.org", "gone;", 400),
    ],
  });
  assert.deepEqual(
    findings.map((f) => [f.kind, f.id ?? null, f.heldBy ?? []]),
    [
      ["key-duplicate", 301, ["a"]],
      ["claim-stale", 400, []],
      ["node-lease-undecodable", null, []],
    ],
  );
});

Deno.test("a duplicate an endpoint or a slice names, or created within the heartbeat timeout, is held; only the unused one is not", () => {
  const recent = new Date(NOW - 60_000).toISOString();
  const findings = judgeDamage(ctx, {
    identities: [
      identity(300, "k;", "2025-01-01T00:00:00Z"),
      identity(301, "k;", "2025-01-01T00:00:01Z"),
      identity(302, "k;", "2025-01-01T00:00:02Z"),
      identity(303, "k;", "2025-01-01T00:00:03Z"),
      identity(304, "k;", recent),
    ],
    nodeLeases: [],
    claims: [],
    endpoints: [{
      metadata: { name: "pod-1", namespace: "prod" },
      status: { identity: { id: 301 } },
    }],
    endpointSlices: [{ metadata: { name: "ces-1" }, endpoints: [{ name: "pod-2", id: 302 }] }],
  });
  const until = new Date(Date.parse(recent) + 1_000 + 30 * 60_000).toISOString().replace(
    ".000",
    "",
  );
  assert.deepEqual(findings.map((f) => [f.kind, f.id, f.heldBy ?? []]), [
    ["key-duplicate", 301, ["CiliumEndpoint prod/pod-1"]],
    ["key-duplicate", 302, ["CiliumEndpointSlice ces-1"]],
    ["key-duplicate", 303, []],
    ["key-duplicate", 304, [`new or marked recently (in use until ${until})`]],
  ]);
});

Deno.test("claims: a young stale one is not damage yet, one naming a damaged identity is not stale", () => {
  const written = (c: ReturnType<typeof claim>, at: number) => ({
    ...c,
    spec: { renewTime: new Date(at).toISOString() },
  });
  const quietMs = claimQuietMs(ctx.settings);
  const findings = judgeDamage(ctx, {
    readAt: NOW,
    identities: [{ metadata: { name: "500" }, "security-labels": { x: "y" } }],
    nodeLeases: [],
    claims: [
      written(claim(ctx.resourceName, "young;", 400), NOW - quietMs),
      written(claim(ctx.resourceName, "old;", 401), NOW - quietMs - 1),
      claim(ctx.resourceName, "damaged;", 500),
    ],
  });
  assert.deepEqual(findings.map((f) => [f.kind, f.id ?? null]), [
    ["master-undecodable", 500],
    ["claim-stale", 401],
  ]);
  // Removing the damaged identity removes the claim naming it (quiet when listed) too.
  assert.deepEqual(
    (decodeToken(findings[0].token, "k8s") as { claim?: unknown }).claim,
    { name: claimName(ctx.resourceName, "damaged;"), rv: "1" },
  );
});

Deno.test("a reference without an epoch is held by its node while that node's Lease is live", () => {
  const findings = judgeDamage(ctx, {
    identities: [identity(300, "k;", "2026-01-01T00:00:00Z", { a: "", gone: "" })],
    nodeLeases: [nodeLeaseObject("a", "e1", 60, NOW, NOW)],
    claims: [],
  });
  assert.deepEqual(findings.map((f) => [f.kind, f.entry, f.heldBy ?? []]), [
    ["reference-undecodable", "ciliumidentities.cilium.io/300 ref.idalloc.io/a", ["a"]],
    ["reference-undecodable", "ciliumidentities.cilium.io/300 ref.idalloc.io/gone", []],
  ]);
});

Deno.test("a key over the layout's limit is master-oversized", () => {
  const findings = judgeDamage(ctx, {
    identities: [{
      metadata: { name: "5" },
      "security-labels": { "idalloc:key": "k".repeat(MAX_KEY_BYTES + 1) },
    }],
    nodeLeases: [],
    claims: [],
  });
  assert.deepEqual(findings.map((f) => [f.kind, f.id]), [["master-oversized", 5]]);
});

// On the real API server, through the CLI.

k8sTest(
  "doctor shows who uses each duplicate; --fix keeps those a CiliumEndpoint or a CiliumEndpointSlice names or that were created recently, and removes the unused one",
  async () => {
    await using fx = await fixture();
    const labels = { "k8s:app": "web" };
    await fx.createIdentity(300, labels); // Cilium's answer, the oldest
    await new Promise((resolve) => setTimeout(resolve, 1_100)); // creation has 1 s resolution
    for (const id of [301, 302, 303]) await fx.createIdentity(id, labels);
    await fx.endpoint("pod-1", 301);
    await fx.endpointSlice("ces-1", [302]);
    // A heartbeat timeout the CLI's lease allows, passed for 301–303; 304 is created within it.
    await new Promise((resolve) => setTimeout(resolve, 6_000));
    await fx.createIdentity(304, labels);
    const kubeconfig = await fx.cluster.kubeconfig("admin", { namespace: fx.namespace });
    const args = [
      "--store",
      `k8s:${kubeconfig}`,
      "--prefix",
      `ciliumidentities.${fx.group}/v2`,
      "--heartbeat-timeout",
      "4s",
      "--lease-ttl",
      "3s",
      "--clock-skew",
      "500ms",
      "doctor",
    ];
    const held = (f: { id: number; heldBy?: string[] }) => [f.id, f.heldBy ?? []];

    const listed = await cli([...args, "--json"]);
    assert.equal(listed.code, 4, listed.stderr);
    const findings = JSON.parse(listed.stdout);
    assert.deepEqual(findings.map((f: { kind: string }) => f.kind), Array(4).fill("key-duplicate"));
    assert.deepEqual(findings.map(held).slice(0, 3), [
      [301, [`CiliumEndpoint ${fx.namespace}/pod-1`]],
      [302, ["CiliumEndpointSlice ces-1"]],
      [303, []],
    ]);
    assert.match(findings[3].heldBy.join(), /^new or marked recently \(in use until /);
    const human = await cli(args);
    assert.match(human.stdout, /HELD BY/);
    assert.match(
      human.stdout,
      new RegExp(`key-duplicate .* CiliumEndpoint ${fx.namespace}/pod-1 +`),
    );
    assert.match(human.stderr, /in use by Cilium/);

    const fixed = await cli([...args, "--fix", "--json"]);
    assert.equal(fixed.code, 4, fixed.stderr);
    assert.deepEqual(
      JSON.parse(fixed.stdout).map((f: { id: number; outcome: string }) => [f.id, f.outcome]),
      [[301, "held"], [302, "held"], [303, "removed"], [304, "held"]],
    );
    assert.deepEqual((await fx.records()).map((r) => r.id).sort(), [300, 301, 302, 304]);
  },
);
