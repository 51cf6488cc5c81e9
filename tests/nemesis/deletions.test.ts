// The check a Kubernetes run beside Cilium CRD-mode nodes adds: no identity an idalloc node holds
// (its reference under its Lease's live epoch) or a CiliumEndpoint names is deleted, by idalloc's
// GC or by Cilium's operator rule — judged on a constructed store record (deletions with their
// last state, Leases, endpoint references) and GC log; and its attribution class.
import assert from "node:assert/strict";
import { attribute } from "../../nemesis/checks/attribution.ts";
import { checkDeletions, DELETION_CHECK, type GcPass } from "../../nemesis/checks/deletions.ts";
import { type StoreChange, StoreHistory } from "../../nemesis/checks/store_history.ts";
import { EndpointTracker } from "../../nemesis/cilium.ts";

const T = 1_000_000;
const K = "k8s:app=k3;";
const SKEW = 500;

/** An endpoint of Cilium node `node` naming `id` (`null`: deleted) at revision `rev`. */
function endpoint(rev: number, node: string, id: number | null): StoreChange {
  return id === null
    ? { t: "ref", rev, at: T + rev, key: K, node, id: null }
    : { t: "ref", rev, at: T + rev, key: K, node, id, lease: "cep" };
}

/** Node `node`'s Lease at revision `rev`: epoch and expiry. */
function lease(rev: number, node: string, epoch: string | null, expiresAt: number | null) {
  return { t: "lease", rev, at: T + rev, node, epoch, expiresAt } as const;
}

/** Identity `id`'s deletion at revision `rev`, with its last references. */
function deleted(rev: number, id: number, refs: Record<string, string> = {}, inferred = false) {
  return {
    t: "deleted",
    rev,
    at: T + rev,
    id,
    key: K,
    refs,
    marked: true,
    ...(inferred ? { inferred } : {}),
  } as const;
}

function check(changes: StoreChange[], gcPasses: GcPass[] = []) {
  return checkDeletions({ changes, gcPasses, skewMs: SKEW });
}

function classOf(v: { evidence?: unknown }): string {
  return (v.evidence as { class: string }).class;
}

Deno.test("deletions: the operator deleting an identity an endpoint names is flagged, Cilium's own", () => {
  const r = check([endpoint(10, "c0", 300), deleted(20, 300)]);
  assert.equal(r.violations.length, 1);
  assert.equal(r.violations[0].check, DELETION_CHECK);
  assert.equal(classOf(r.violations[0]), "Cilium-only");
  assert.deepEqual((r.violations[0].evidence as { namedBy: string[] }).namedBy, ["c0"]);
  assert.deepEqual(r.byDeleter, { "idalloc GC": 0, "Cilium operator": 1 });
});

Deno.test("deletions: idalloc's GC deleting an identity an endpoint names is idalloc's", () => {
  const r = check([endpoint(10, "c0", 300), deleted(20, 300)], [
    { start: T + 15, end: T + 25, deleted: [300] },
  ]);
  assert.equal(r.violations.length, 1);
  assert.equal(classOf(r.violations[0]), "idalloc-only");
  assert.deepEqual(r.byDeleter, { "idalloc GC": 1, "Cilium operator": 0 });
});

Deno.test("deletions: the operator deleting an identity an idalloc node holds under a live Lease is idalloc's", () => {
  const r = check([lease(5, "w0", "e1", T + 60_000), deleted(20, 300, { w0: "e1" })]);
  assert.equal(r.violations.length, 1);
  assert.equal(classOf(r.violations[0]), "mixed (idalloc's)");
  assert.deepEqual((r.violations[0].evidence as { heldBy: string[] }).heldBy, ["w0"]);
});

Deno.test("deletions: references that are dead at the deletion, and endpoints gone before it, hold nothing", () => {
  const r = check([
    // w0's Lease has another epoch (revoked); w1's expired before the deletion (within the skew
    // margin counts as expired); w2 has no Lease.
    lease(5, "w0", "e2", T + 60_000),
    lease(6, "w1", "e1", T + 20 + SKEW),
    endpoint(10, "c0", 300),
    endpoint(12, "c0", null),
    endpoint(13, "c1", 301),
    deleted(20, 300, { w0: "e1", w1: "e1", w2: "e1" }),
  ]);
  assert.deepEqual(r.violations, []);
  assert.equal(r.deletions, 1);
});

Deno.test("deletions: the store's order decides, not the arrival: an endpoint written after the deletion holds nothing", () => {
  const r = check([deleted(20, 300), endpoint(21, "c0", 300)]);
  assert.deepEqual(r.violations, []);
});

Deno.test("deletions: a deletion inferred across a gap of the record is uncertain, not a violation", () => {
  const r = check([endpoint(10, "c0", 300), deleted(20, 300, {}, true)]);
  assert.deepEqual(r.violations, []);
  assert.equal(r.uncertain.length, 1);
});

Deno.test("deletions: the attribution counts them by their class", () => {
  const r = check([
    endpoint(10, "c0", 300),
    lease(11, "w0", "e1", T + 60_000),
    deleted(20, 300),
    deleted(21, 301, { w0: "e1" }),
  ]);
  const summary = attribute(r.violations, {
    ciliumIncs: new Set(),
    ciliumNodes: new Set(["c0"]),
    store: new StoreHistory([]),
    faults: [],
    stops: [],
    records: [],
    leaseTtlMs: 5_000,
    checks: { deletion: DELETION_CHECK },
  });
  assert.equal(summary.counts["Cilium-only"], 1);
  assert.equal(summary.counts["mixed (idalloc's)"], 1);
});

Deno.test("endpoints: a key's first use writes its endpoint, its last release and the node's end delete it", () => {
  const writes: [string, string, number | undefined][] = [];
  const t = new EndpointTracker("c0", (node, key, id) => writes.push([node, key, id]));
  const line = (o: unknown) => t.line(JSON.stringify(o));
  line({ op: "allocate", key: K, id: 300, node: "c0" });
  line({ op: "allocate", key: K, id: 300, node: "c0" });
  line({ op: "release-start", key: K, node: "c0" });
  assert.deepEqual(writes, [["c0", K, 300]]);
  line({ op: "release-start", key: K, node: "c0", last: true });
  line({ op: "allocate", key: "k8s:app=k4;", id: 301, node: "c0" });
  line({ op: "error", err: "boom" });
  t.drop();
  assert.deepEqual(writes, [
    ["c0", K, 300],
    ["c0", K, undefined],
    ["c0", "k8s:app=k4;", 301],
    ["c0", "k8s:app=k4;", undefined],
  ]);
});
