/**
 * The byte-budget batching both backends cut their work with (etcd's ensure and GC reads under the
 * request size, Deno KV's ensure commits under the total key size).
 */
import assert from "node:assert/strict";
import { batches } from "../../../src/backends/shared/batching.ts";

Deno.test("batches keep the items' order and every item, cutting at the weight budget", () => {
  const items = Array.from({ length: 10 }, (_, i) => i);
  const out = batches(items, { maxWeight: 25 }, (i) => i);
  assert.deepEqual(out.flat(), items);
  // 0+1+…+6 = 21 ≤ 25; then 7+8 = 15 (7+8+9 = 24 ≤ 25): [7, 8, 9].
  assert.deepEqual(out, [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9]]);
  for (const batch of out) assert.ok(batch.reduce((a, b) => a + b, 0) <= 25);
});

Deno.test("without a count bound only the weight cuts (Deno KV's commits)", () => {
  const out = batches(Array.from({ length: 1000 }, (_, i) => i), { maxWeight: 1000 }, () => 1);
  assert.deepEqual(out.map((b) => b.length), [1000]);
});

Deno.test("the count bound cuts before the weight does (etcd's transactions)", () => {
  const out = batches(
    Array.from({ length: 7 }, (_, i) => i),
    { maxWeight: 1000, maxCount: 3 },
    () => 1,
  );
  assert.deepEqual(out, [[0, 1, 2], [3, 4, 5], [6]]);
});

Deno.test("an item heavier than the budget gets a batch of its own, never dropped", () => {
  const out = batches(["a", "huge", "b", "c"], { maxWeight: 10 }, (s) => (s === "huge" ? 50 : 4));
  assert.deepEqual(out, [["a"], ["huge"], ["b", "c"]]);
  assert.deepEqual(batches([], { maxWeight: 10 }, () => 1), []);
});
