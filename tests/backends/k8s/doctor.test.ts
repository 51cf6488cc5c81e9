// The damage report's judgement on plain data: a snapshot of identities, node Leases and claims
// in, findings out — a duplicate held by a live node (its reference under the Lease's epoch) is
// marked held, a stale claim and a Lease without an epoch are found, another resource's claim is
// not this store's business; a stale claim only once quiet, not one naming a damaged identity
// (removed with it); a reference without an epoch held by its live node; an oversized key.
import assert from "node:assert/strict";
import { decodeToken } from "../../../src/allocator/damage.ts";
import { claimQuietMs } from "../../../src/backends/k8s/claim.ts";
import { judgeDamage } from "../../../src/backends/k8s/doctor.ts";
import { MAX_KEY_BYTES } from "../../../src/backends/k8s/limits.ts";
import { claimName, nodeLeaseObject } from "../../../src/backends/k8s/layout.ts";
import { resolveK8sOptions } from "../../../src/backends/k8s/options.ts";

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
      identity(300, "k;", "2026-01-01T00:00:00Z"),
      identity(301, "k;", "2026-01-01T00:00:01Z", { a: "e1" }),
      identity(302, "j;", "2026-01-01T00:00:00Z", { a: "e0" }),
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
