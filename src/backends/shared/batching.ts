/**
 * Budget batching shared by the backends: a list of writes or reads is cut, in order, into batches
 * that each fit one request of the store — etcd's request size and operations a level, Deno KV's
 * checks and total key size of an atomic operation. Like group commit's (`group_commit.ts`), the
 * budget is a list of `limits`, and each item weighs something against each of them.
 *
 * @example Items of 30 bytes under a 100-byte budget, then also at most 2 items a batch
 * ```ts
 * import assert from "node:assert/strict";
 * import { batches } from "./batching.ts";
 *
 * const items = [0, 1, 2, 3, 4];
 * assert.deepEqual(batches(items, [100], () => [30]), [[0, 1, 2], [3, 4]]);
 * assert.deepEqual(batches(items, [2, 100], () => [1, 30]), [[0, 1], [2, 3], [4]]);
 * ```
 *
 * @module
 */

/**
 * Splits `items`, in order, into batches whose summed weights stay within every one of `limits`.
 * `weigh` gives an item's weight against each limit, given the batch it would join: a cost paid
 * once a batch (one check of a node's lease record for all its references) is weighed for the
 * first item that needs it, and weighed again when the item opens a new batch. An item that alone
 * exceeds a limit gets a batch of its own rather than being dropped: the store, not the batching,
 * decides whether it fits.
 */
export function batches<T>(
  items: readonly T[],
  limits: readonly number[],
  weigh: (item: T, batch: readonly T[]) => readonly number[],
): T[][] {
  const out: T[][] = [];
  let current: T[] = [];
  let used = limits.map(() => 0);
  for (const item of items) {
    let weights = weigh(item, current);
    if (current.length > 0 && limits.some((limit, i) => used[i] + weights[i] > limit)) {
      out.push(current);
      current = [];
      used = limits.map(() => 0);
      weights = weigh(item, current);
    }
    current.push(item);
    used = used.map((u, i) => u + weights[i]);
  }
  if (current.length > 0) out.push(current);
  return out;
}
