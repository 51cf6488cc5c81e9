/** etcd's size limits and the batching under them, without etcd. */
import assert from "node:assert/strict";
import {
  BATCH_BYTES,
  KEY_COPIES_PER_TXN,
  MAX_KEY_BYTES,
} from "../../../src/backends/etcd/limits.ts";
import { batches } from "../../../src/backends/shared/batching.ts";

Deno.test("batches stay under the request budget and the count", () => {
  const limits = [50, BATCH_BYTES];
  const small = batches(Array.from({ length: 120 }, (_, i) => i), limits, () => [1, 10]);
  assert.deepEqual(small.map((b) => b.length), [50, 50, 20]);
  const heavy = batches([1, 2, 3, 4], limits, () => [1, BATCH_BYTES / 2 + 1]);
  assert.deepEqual(heavy.map((b) => b.length), [1, 1, 1, 1]);
  assert.ok(MAX_KEY_BYTES * KEY_COPIES_PER_TXN < 1_572_864);
});
