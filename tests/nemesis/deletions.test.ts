// The check a Kubernetes run beside Cilium CRD-mode nodes adds: no identity an idalloc node holds
// (its reference under its Lease's live epoch) or a CiliumEndpoint names is deleted, by idalloc's
// GC or by Cilium's operator rule — judged on a constructed store record (deletions with their
// last state, Leases, endpoint references) and GC log; and its attribution class.
import assert from "node:assert/strict";
import { attribute } from "../../nemesis/checks/attribution.ts";
import { checkDeletions, DELETION_CHECK, type GcPass } from "../../nemesis/checks/deletions.ts";
import { type StoreChange, StoreHistory } from "../../nemesis/checks/store_history.ts";
import { EndpointTracker } from "../../nemesis/cilium.ts";
import { OVERSIZED_KEY_PREFIX } from "../../src/testing/nemesis.ts";

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

/** Node `node`'s (idalloc) reference of the key naming `id` under `epoch` at revision `rev`. */
function ref(rev: number, node: string, id: number | null, epoch = "e1"): StoreChange {
  return id === null
    ? { t: "ref", rev, at: T + rev, key: K, node, id: null }
    : { t: "ref", rev, at: T + rev, key: K, node, id, lease: epoch };
}

/** A successful allocate of the key by `node` (incarnation `inc`) answering `id`. */
function allocated(
  node: string,
  id: number,
  start: number,
  end: number,
  inc = `${node}@1`,
  isNew?: boolean,
) {
  return {
    t: "call",
    node,
    inc,
    op: "allocate",
    key: K,
    start: T + start,
    end: T + end,
    ok: true,
    id,
    held: false,
    ...(isNew === undefined ? {} : { isNew }),
  } as const;
}

/** A last-use release of the key by `node`. */
function released(node: string, start: number, end: number, inc = `${node}@1`) {
  return {
    t: "call",
    node,
    inc,
    op: "release",
    key: K,
    start: T + start,
    end: T + end,
    ok: true,
    held: true,
    lastUse: true,
  } as const;
}

// Seed 3 of the mixed Kubernetes runs (k8s:app=k44;, identity 342): w0 held the key on 342,
// released it; 342 was marked and, a grace later, deleted by a GC pass that started at
// 09:16:53.802; w0's allocate of the key started at 55.176, wrote its reference to 342 at 55.246
// (rev 8661), and GC's delete landed at 55.273 (rev 8663) before w0's unmark; w0 answered 436, the
// key's other identity, at 55.555. The reference appeared after the pass had read the reference objects: a join under
// way (`refs.ts`, case 2), not a hold. The check used to count it held and fail the run.
Deno.test("deletions: a join's reference written during the deleting GC pass, by a node that answered another identity, raced the delete: reported, not failed", () => {
  const records = [
    allocated("w0", 300, 0, 10),
    released("w0", 40, 45),
    allocated("w0", 301, 130, 180), // the join of 300 that lost it to the delete
  ];
  const changes = [
    lease(5, "w0", "e1", T + 60_000),
    ref(10, "w0", 300),
    ref(45, "w0", null),
    ref(150, "w0", 300),
    deleted(152, 300, { w0: "e1" }),
  ];
  const passes = [{ start: T + 100, end: T + 200, deleted: [300] }];
  const r = checkDeletions({ changes, gcPasses: passes, skewMs: SKEW, records });
  assert.deepEqual(r.violations, []);
  assert.equal(r.raced.length, 1);
  assert.deepEqual(
    [r.raced[0].id, r.raced[0].joinedBy, r.raced[0].heldBy, r.raced[0].deleter],
    [300, ["w0"], [], "idalloc GC"],
  );
});

Deno.test("deletions: a reference in the record before the deleting GC pass started is held, whatever its node answered (the pass read it)", () => {
  const changes = [
    lease(5, "w0", "e1", T + 60_000),
    ref(90, "w0", 300),
    deleted(152, 300, {
      w0: "e1",
    }),
  ];
  const passes = [{ start: T + 100, end: T + 200, deleted: [300] }];
  const r = checkDeletions({ changes, gcPasses: passes, skewMs: SKEW, records: [] });
  assert.equal(r.violations.length, 1);
  assert.equal(classOf(r.violations[0]), "idalloc-only");
  assert.deepEqual((r.violations[0].evidence as { heldBy: string[] }).heldBy, ["w0"]);
  assert.deepEqual(r.raced, []);
});

Deno.test("deletions: a joiner that answered the identity before its deletion held it (refs.ts, case 3: answered without removing the mark)", () => {
  const changes = [
    lease(5, "w0", "e1", T + 60_000),
    ref(150, "w0", 300),
    deleted(170, 300, {
      w0: "e1",
    }),
  ];
  const passes = [{ start: T + 100, end: T + 200, deleted: [300] }];
  const records = [allocated("w0", 300, 140, 160)];
  const r = checkDeletions({ changes, gcPasses: passes, skewMs: SKEW, records });
  assert.equal(r.violations.length, 1);
  assert.equal(classOf(r.violations[0]), "idalloc-only");
  assert.deepEqual(r.raced, []);
});

// Seed 3 again (k8s:app=k140;, identity 274): the probe's allocate ran 09:17:16.791–17.313, wrote
// its reference at 16.860, GC deleted 274 at 17.090 and the probe's 274 was created again at 17.317.
// Its answer came after the deletion; had it come before (a join that answered without removing
// the mark, case 3) the call would still have ended after it. The call tells: a join that lost the
// identity to the delete created it again from the claim and answers it as new.
Deno.test("deletions: an allocate under way at the deletion that answered the identity without creating it held it; one that created it again raced", () => {
  const changes = [
    lease(5, "p", "e1", T + 60_000),
    ref(150, "p", 300),
    deleted(170, 300, {
      p: "e1",
    }),
  ];
  const passes = [{ start: T + 100, end: T + 200, deleted: [300] }];
  const judge = (isNew: boolean | undefined) =>
    checkDeletions({
      changes,
      gcPasses: passes,
      skewMs: SKEW,
      records: [allocated("p", 300, 140, 400, "p@probe", isNew)],
    });
  assert.equal(judge(false).violations.length, 1, "joined: its answer may predate the deletion");
  assert.equal(judge(undefined).violations.length, 1, "not logged: counted as joined");
  const recreated = judge(true);
  assert.deepEqual(recreated.violations, []);
  assert.equal(recreated.raced.length, 1);
});

Deno.test("deletions: for the operator's deletions a live reference counts with an answer not released since, of the node's running incarnation", () => {
  const changes = [
    lease(5, "w0", "e1", T + 60_000),
    lease(6, "w1", "e1", T + 60_000),
    lease(7, "w2", "e1", T + 60_000),
    ref(10, "w0", 300),
    ref(11, "w1", 300),
    ref(12, "w2", 300),
    deleted(100, 300, { w0: "e1", w1: "e1", w2: "e1" }),
  ];
  const records = [
    // w0 answered 300 and holds it; w1 released it (its reference's removal still under way);
    // w2 answered it in an incarnation that was killed, and its new one has not answered it yet.
    allocated("w0", 300, 5, 20),
    allocated("w1", 300, 5, 20),
    released("w1", 60, 120),
    allocated("w2", 300, 5, 20, "w2@1"),
    { t: "ready", node: "w2", inc: "w2@2", pid: 2, at: T + 50 } as const,
  ];
  const r = checkDeletions({ changes, gcPasses: [], skewMs: SKEW, records });
  assert.equal(r.violations.length, 1);
  assert.equal(classOf(r.violations[0]), "mixed (idalloc's)");
  assert.deepEqual((r.violations[0].evidence as { heldBy: string[] }).heldBy, ["w0"]);
  assert.deepEqual((r.violations[0].evidence as { joinedBy: string[] }).joinedBy, ["w1", "w2"]);

  // Without w0's answer, only joins: raced.
  const rest = checkDeletions({ changes, gcPasses: [], skewMs: SKEW, records: records.slice(1) });
  assert.deepEqual(rest.violations, []);
  assert.equal(rest.raced.length, 1);
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

Deno.test("deletions: an ID once planted as garbage is judged again once a real key took it", () => {
  const planted = new Set([300]);
  const gcPasses = [{ start: T + 15, end: T + 25, deleted: [300] }];
  // The real key K holds ID 300 now (the planted master was collected before): its deletion under
  // an endpoint is judged, not skipped as garbage.
  const real = checkDeletions({
    changes: [endpoint(10, "c0", 300), deleted(20, 300)],
    gcPasses,
    skewMs: SKEW,
    planted,
  });
  assert.equal(real.violations.length, 1);
  // The planted master itself (its oversized key) is garbage: its deletion is GC's job.
  const garbage = checkDeletions({
    changes: [endpoint(10, "c0", 300), {
      ...deleted(20, 300),
      key: `${OVERSIZED_KEY_PREFIX}x;`,
    }],
    gcPasses,
    skewMs: SKEW,
    planted,
  });
  assert.equal(garbage.violations.length, 0);
});
