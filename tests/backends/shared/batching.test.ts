/**
 * The budget batching both backends cut their work with: etcd's ensure and GC reads under the
 * request size and a count, Deno KV's ensure commits under the total key size, and its sweeps
 * under the checks and key size of one commit, with a check paid once per node.
 */
import assert from "node:assert/strict";
import { batches } from "../../../src/backends/shared/batching.ts";

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);

Deno.test("batches keep the items' order and every item, cutting at the budget", () => {
  const items = Array.from({ length: 10 }, (_, i) => i);
  const out = batches(items, [25], (i) => [i]);
  assert.deepEqual(out.flat(), items);
  // 0+1+…+6 = 21 ≤ 25 (adding 7 would make 28); then 7+8+9 = 24 ≤ 25.
  assert.deepEqual(out, [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9]]);
  for (const batch of out) assert.ok(sum(batch) <= 25);
});

Deno.test("a batch ends at whichever limit is reached first", () => {
  const items = Array.from({ length: 7 }, (_, i) => i);
  // Count first (etcd: transactions a request may carry).
  assert.deepEqual(batches(items, [3, 1000], () => [1, 1]), [[0, 1, 2], [3, 4, 5], [6]]);
  // Bytes first.
  assert.deepEqual(batches(items, [1000, 20], () => [1, 10]), [[0, 1], [2, 3], [4, 5], [6]]);
  // A single limit never cuts what fits (Deno KV's ensure: key bytes only).
  assert.deepEqual(batches(items, [1000], () => [1]), [items]);
});

Deno.test("a cost paid once a batch is weighed again for the item that opens the next", () => {
  // Deno KV's sweep: references sorted by node share their node's lease check in one commit.
  const refs = ["a", "a", "a", "b", "b", "c"];
  const checks = (r: string, batch: readonly string[]) => batch.at(-1) === r ? 1 : 2;
  const weighed: number[] = [];
  const out = batches(refs, [4], (r, batch) => {
    const c = checks(r, batch);
    weighed.push(c);
    return [c];
  });
  // a,a,a cost 2+1+1 = 4; b would add 2 (6 > 4): a new batch, where b costs 2 again; b,b cost
  // 3 and c would add 2 (5 > 4): a new batch again.
  assert.deepEqual(out, [["a", "a", "a"], ["b", "b"], ["c"]]);
  for (const batch of out) {
    assert.ok(sum(batch.map((r, i) => checks(r, batch.slice(0, i)))) <= 4);
  }
  assert.deepEqual(weighed, [2, 1, 1, 2, 2, 1, 2, 2]);
});

Deno.test("an item heavier than the budget gets a batch of its own, never dropped", () => {
  const out = batches(["a", "huge", "b", "c"], [10], (s) => [s === "huge" ? 50 : 4]);
  assert.deepEqual(out, [["a"], ["huge"], ["b", "c"]]);
  assert.deepEqual(batches([], [10], () => [1]), []);
});
