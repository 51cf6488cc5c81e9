/**
 * Candidate IDs for a new key, as the backends that pick them themselves ask the allocator for
 * them (Deno KV, Kubernetes): the next candidate not yet tried, or a pool-exhausted error; and
 * whether an ID found in the store may be the key's ID in this allocator's range.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { pickCandidate, usable } from "./candidates.ts";
 *
 * const req = { key: "k", pickCandidate: (ex: ReadonlySet<number>) => ex.has(7) ? undefined : 7 };
 * assert.equal(pickCandidate(req, new Set()), 7);
 * assert.throws(() => pickCandidate(req, new Set([7])), { name: "PoolExhaustedError" });
 * assert.equal(usable({ min: 1, max: 10 }, 7), true);
 * assert.equal(usable(undefined, 0), false);
 * ```
 *
 * @module
 */
import type { AcquireRequest } from "../../allocator/backend.ts";
import { PoolExhaustedError } from "../../errors.ts";

/**
 * The allocator's next candidate for `req.key` outside `exclude` (the IDs this call already found
 * taken); {@linkcode PoolExhaustedError} when none is left.
 */
export function pickCandidate(
  req: Pick<AcquireRequest, "key" | "pickCandidate">,
  exclude: ReadonlySet<number>,
): number {
  const candidate = req.pickCandidate(exclude);
  if (candidate === undefined) {
    throw new PoolExhaustedError(Number.NaN, Number.NaN, {
      cause: new Error(`no candidate ID left for key '${req.key}'`),
    });
  }
  return candidate;
}

/** Whether `id` may become a key's ID: a positive safe integer within `range` (if any). */
export function usable(range: AcquireRequest["range"], id: number): boolean {
  return Number.isSafeInteger(id) && id > 0 &&
    (range === undefined || (id >= range.min && id <= range.max));
}
