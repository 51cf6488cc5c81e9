/**
 * etcd limits and the backend's own batch sizes and bounds, in one place (as the Deno KV
 * backend's `limits.ts`): sizes follow from etcd's default request limit, and batching under them
 * is `../shared/batching.ts`'s, with {@linkcode BATCH_BYTES} as the budget.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { MAX_KEY_BYTES } from "./limits.ts";
 * assert.equal(MAX_KEY_BYTES, 78233);
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

/** Transactions one `acquire` may spend before giving up with a `ConflictError`. */
export const MAX_ACQUIRE_ROUNDS = 3;

/** Transactions one request may carry. */
export const MAX_BATCH = 64;

/**
 * Held keys per read/write transaction pair: up to four reads per key (master, references, and
 * two Cilium mutexes); etcd allows 128 operations a level.
 */
export const ENSURE_BATCH = 32;

/** Cilium's `etcdMaxKeysPerLease`. */
export const MAX_KEYS_PER_LEASE = 1000;
