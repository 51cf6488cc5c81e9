/**
 * Size limits that follow from etcd's default request limit, and batching under them.
 *
 * @example
 * ```ts
 * import { batches, MAX_KEY_BYTES } from "./limits.ts";
 * console.log(MAX_KEY_BYTES); // 78233
 * console.log(batches([1, 2, 3], 2, () => 1)); // [[1, 2], [3]]
 * ```
 *
 * @module
 */

/** etcd's default `--max-request-bytes` (1.5 MiB). */
export const ETCD_MAX_REQUEST_BYTES = 1_572_864;

/**
 * How many times the largest transaction (acquiring an existing key through the full agreement
 * ladder) carries the key's bytes: master value, range bounds of three compares and two reads,
 * three copies of the reference put, and the bounds of the Cilium mutex range of the key in a
 * compare and a read.
 */
export const KEY_COPIES_PER_TXN = 20;

/** The largest encoded key (UTF-8 bytes) whose transactions still fit one etcd request. */
export const MAX_KEY_BYTES: number = Math.floor(
  (ETCD_MAX_REQUEST_BYTES - 8_192) / KEY_COPIES_PER_TXN,
);

/** Payload budget of one batched transaction (ensure, GC reads), leaving headroom. */
export const BATCH_BYTES = 1_048_576;

/** UTF-8 length of `s`. */
export function utf8Length(s: string): number {
  return new TextEncoder().encode(s).length;
}

/**
 * Splits `items` into batches of at most `maxCount` items whose summed `weight` stays within
 * {@linkcode BATCH_BYTES} (a single heavier item still gets a batch of its own).
 */
export function batches<T>(
  items: readonly T[],
  maxCount: number,
  weight: (item: T) => number,
): T[][] {
  const out: T[][] = [];
  let current: T[] = [];
  let bytes = 0;
  for (const item of items) {
    const w = weight(item);
    if (current.length > 0 && (current.length >= maxCount || bytes + w > BATCH_BYTES)) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(item);
    bytes += w;
  }
  if (current.length > 0) out.push(current);
  return out;
}
