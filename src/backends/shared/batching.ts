/**
 * Byte-budget batching shared by the backends: a list of writes or reads is cut, in order, into
 * batches that each fit one request of the store (etcd's request size, Deno KV's total key size of
 * an atomic operation) and, where the store also bounds it, a number of items.
 *
 * @example Ten items of 30 bytes under a 100-byte budget and at most 2 a batch
 * ```ts
 * import assert from "node:assert/strict";
 * import { batches } from "./batching.ts";
 *
 * const items = Array.from({ length: 5 }, (_, i) => i);
 * assert.deepEqual(batches(items, { maxWeight: 100 }, () => 30), [[0, 1, 2], [3, 4]]);
 * assert.deepEqual(batches(items, { maxWeight: 100, maxCount: 2 }, () => 30), [[0, 1], [2, 3], [4]]);
 * ```
 *
 * @module
 */

/** What one batch may hold. */
export interface BatchBudget {
  /** Summed weight of a batch at most (an item heavier on its own still gets a batch). */
  readonly maxWeight: number;
  /** Items a batch at most; unbounded when absent. */
  readonly maxCount?: number;
}

/**
 * Splits `items`, in order, into batches of at most `budget.maxCount` items whose summed `weight`
 * stays within `budget.maxWeight`. An item that alone outweighs the budget gets a batch of its
 * own rather than being dropped: the store, not the batching, decides whether it fits.
 */
export function batches<T>(
  items: readonly T[],
  budget: BatchBudget,
  weight: (item: T) => number,
): T[][] {
  const maxCount = budget.maxCount ?? Infinity;
  const out: T[][] = [];
  let current: T[] = [];
  let total = 0;
  for (const item of items) {
    const w = weight(item);
    if (current.length > 0 && (current.length >= maxCount || total + w > budget.maxWeight)) {
      out.push(current);
      current = [];
      total = 0;
    }
    current.push(item);
    total += w;
  }
  if (current.length > 0) out.push(current);
  return out;
}
