// The node Lease's decisions on plain data: opening (create, refuse a live one unless restarting,
// take over a lapsed one) and what a refused write means (retry, replace, or lost to another live
// process, which is never taken back while it lives).
import assert from "node:assert/strict";
import { classifyRefusal, newEpoch, planOpen } from "../../../src/backends/k8s/lease.ts";
import type { NodeLeaseRecord } from "../../../src/backends/k8s/layout.ts";

const SKEW = 5_000;
const lease = (epoch: string, expiresAt: number): NodeLeaseRecord => ({
  name: "idalloc-node-a",
  node: "a",
  epoch,
  expiresAt,
  rv: "7",
});

Deno.test("open: absent → create; live → in use unless restart; lapsed → take over", () => {
  assert.deepEqual(planOpen(undefined, 1_000, SKEW, false), { kind: "create" });
  assert.deepEqual(planOpen(lease("e1", 10_000), 12_000, SKEW, false), {
    kind: "inUse",
    expiresAt: 10_000,
  });
  assert.deepEqual(planOpen(lease("e1", 10_000), 12_000, SKEW, true), { kind: "take", rv: "7" });
  // Live until expiresAt + skew (the holder's clock may lag ours by the skew).
  assert.deepEqual(planOpen(lease("e1", 10_000), 15_000, SKEW, false), { kind: "take", rv: "7" });
  // A Lease without an end (hand-made) is not live.
  const endless = { name: "idalloc-node-a", node: "a", rv: "3" };
  assert.deepEqual(planOpen(endless, 0, SKEW, false), { kind: "take", rv: "3" });
});

Deno.test("a refused write: same epoch → retry; gone or lapsed → replace; live other → lost", () => {
  assert.deepEqual(classifyRefusal(undefined, "e1", 0, SKEW), { kind: "replace" });
  assert.deepEqual(classifyRefusal(lease("e1", 10_000), "e1", 0, SKEW), { kind: "retry", rv: "7" });
  assert.deepEqual(classifyRefusal(lease("e2", 10_000), "e1", 12_000, SKEW), {
    kind: "lost",
    epoch: "e2",
    expiresAt: 10_000,
  });
  assert.deepEqual(classifyRefusal(lease("e2", 10_000), "e1", 15_000, SKEW), {
    kind: "replace",
    rv: "7",
  });
});

Deno.test("epochs are random hex", () => {
  const a = newEpoch();
  assert.match(a, /^[0-9a-f]{16}$/);
  assert.notEqual(a, newEpoch());
});
