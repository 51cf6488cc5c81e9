// The store's record of node Leases beside Cilium CRD-mode nodes, without an API server: a Lease
// named for another node than its holder (the `forged-lease` garbage) is none of the holder's.
import assert from "node:assert/strict";
import { nodeLeaseObject } from "../../src/backends/k8s/layout.ts";
import { leaseKind } from "../../src/backends/k8s/testing/nemesis_cilium.ts";

const NOW = Date.parse("2026-11-29T09:24:24Z");

Deno.test("k8s record: a forged Lease does not stand for its holder's", () => {
  const kind = leaseKind("default");
  const real = nodeLeaseObject("w3", "6cf67d946c1bbc33", 6, NOW, NOW - 10_000);
  const [own] = kind.diff(undefined, real, 1811, NOW + 5, false);
  assert.deepEqual(own, {
    t: "lease",
    rev: 1811,
    at: NOW + 5,
    node: "w3",
    epoch: "6cf67d946c1bbc33",
    expiresAt: NOW + 6_000,
  });
  // Seed 7 of the mixed Kubernetes runs: w3's Lease copied as idalloc-node-nemesis-ghost-1 for an
  // hour was recorded as w3's, expiring an hour later.
  const forged = nodeLeaseObject("w3", "6cf67d946c1bbc33", 3_600, NOW, NOW - 10_000);
  forged.metadata.name = "idalloc-node-nemesis-ghost-1";
  assert.deepEqual(kind.diff(undefined, forged, 1815, NOW + 8, false), []);
  assert.deepEqual(kind.diff(forged, undefined, 1900, NOW + 9, false), []);
});
