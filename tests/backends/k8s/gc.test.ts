// GC's judgement on plain data: an identity is in use while a reference on it is live (its node's
// Lease live and carrying its epoch) or a CiliumEndpoint names it; the candidate carries the
// resource version and the time of a GC mark, whoever wrote it.
import assert from "node:assert/strict";
import { candidateOf, endpointIds, inUse } from "../../../src/backends/k8s/gc.ts";
import { readIdentity } from "../../../src/backends/k8s/layout.ts";

const SKEW = 1_000;
const leases = new Map([
  ["live", { name: "idalloc-node-live", node: "live", epoch: "e1", expiresAt: 50_000, rv: "1" }],
  ["dead", { name: "idalloc-node-dead", node: "dead", epoch: "e1", expiresAt: 5_000, rv: "1" }],
]);

Deno.test("in use: a live reference of the Lease's epoch, or an endpoint naming the ID", () => {
  const at = 10_000;
  const rec = (refs: [string, string][]) => ({ id: 300, refs: new Map(refs) });
  assert.equal(inUse(rec([["live", "e1"]]), leases, new Set(), at, SKEW), true);
  assert.equal(inUse(rec([["live", "e0"]]), leases, new Set(), at, SKEW), false, "old epoch");
  assert.equal(inUse(rec([["dead", "e1"]]), leases, new Set(), at, SKEW), false, "lapsed");
  assert.equal(inUse(rec([["gone", "e1"]]), leases, new Set(), at, SKEW), false, "no Lease");
  assert.equal(inUse(rec([]), leases, new Set([300]), at, SKEW), true, "an endpoint names it");
});

Deno.test("endpoints name identities by status.identity.id", () => {
  assert.deepEqual(
    endpointIds([
      { metadata: { name: "a" }, status: { identity: { id: 300 } } },
      { metadata: { name: "b" }, status: { identity: { id: "301" } } },
      { metadata: { name: "c" } },
    ]),
    new Set([300]),
  );
});

Deno.test("a candidate carries the resource version and the mark's time", () => {
  const read = readIdentity({
    metadata: {
      name: "300",
      resourceVersion: "42",
      annotations: { "io.cilium.heartbeat": "2026-01-01T00:00:00.123456789Z" },
    },
    "security-labels": { "idalloc:key": "k" },
  });
  assert.ok(read.ok);
  assert.deepEqual(candidateOf(read.record, false), {
    id: 300,
    key: "k",
    version: "42",
    inUse: false,
    markedAt: Date.parse("2026-01-01T00:00:00.123Z"),
  });
  const unparseable = { ...read.record, mark: "soon" };
  assert.equal(candidateOf(unparseable, false).markedAt, undefined);
});
