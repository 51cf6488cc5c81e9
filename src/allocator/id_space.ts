/**
 * The allocator's ID space: the range `[min, max]` it hands out, the prefix mask ORed into every
 * stored ID (Cilium's cluster ID bits), and the check that an ID the store returns lies in it.
 *
 * The pool works on unmasked IDs; the store and the cache on masked ones. Keeping both mappings
 * here means no other part does bit arithmetic on IDs.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { IdSpace } from "./id_space.ts";
 *
 * const space = new IdSpace(1, 65535, 3 << 16);
 * assert.deepEqual(space.stored, { min: 196609, max: 262143 });
 * assert.equal(space.unmask(space.mask(256)), 256);
 * assert.equal(space.validId(196610, "app=web;"), 196610);
 * assert.throws(() => space.validId(70000, "app=web;"), { name: "InvalidIdError" });
 * ```
 * @module
 */
import { InvalidIdError } from "../errors.ts";

/**
 * An inclusive range of stored IDs. (Defined here, beside the space that makes it, rather than
 * in `backend.ts`, which imports `damage.ts`, which needs it: no circle.)
 */
export interface IdRange {
  /** Lowest ID. */
  readonly min: number;
  /** Highest ID. */
  readonly max: number;
}

/** ORs `mask` into `id` (IDs may exceed 32 bits, so not with `|`). */
export function applyMask(id: number, mask: number): number {
  return mask === 0 ? id : Number(BigInt(id) | BigInt(mask));
}

/** The range an allocator hands out and how its IDs are stored (see the module doc). */
export class IdSpace {
  /** The lowest ID handed out, before the mask. */
  readonly min: number;
  /** The highest ID handed out, before the mask. */
  readonly max: number;
  /** ORed into every stored ID. */
  readonly prefixMask: number;
  /** The stored IDs (mask applied) of the range: what GC scans and the store is told. */
  readonly stored: IdRange;

  /** A space of `[min, max]` stored with `prefixMask` ORed in. */
  constructor(min: number, max: number, prefixMask: number) {
    this.min = min;
    this.max = max;
    this.prefixMask = prefixMask;
    this.stored = { min: applyMask(min, prefixMask), max: applyMask(max, prefixMask) };
  }

  /** The stored form of pool ID `id`. */
  mask(id: number): number {
    return applyMask(id, this.prefixMask);
  }

  /**
   * The pool ID of stored ID `id`. An ID already in the pool's range is left alone: with a mask,
   * an unmasked ID below the mask bits names itself.
   */
  unmask(id: number): number {
    if (this.prefixMask === 0 || (id >= this.min && id <= this.max)) return id;
    return Number(BigInt(id) & ~BigInt(this.prefixMask));
  }

  /** {@linkcode IdSpace.unmask} of every ID of `ids`. */
  unmaskAll(ids: ReadonlySet<number>): ReadonlySet<number> {
    if (this.prefixMask === 0 || ids.size === 0) return ids;
    return new Set([...ids].map((id) => this.unmask(id)));
  }

  /** Whether stored ID `id` lies in this space. */
  contains(id: number): boolean {
    return id >= this.stored.min && id <= this.stored.max;
  }

  /**
   * `id` as the store returned it for `key`; throws {@linkcode InvalidIdError} when it is not a
   * stored ID of this space (a store that answers outside the range must not be believed).
   */
  validId(id: number, key: string): number {
    if (!Number.isSafeInteger(id) || !this.contains(id)) {
      const { min, max } = this.stored;
      throw new InvalidIdError(
        `ID ${id} the store returned for key '${key}' is outside this allocator's range [${min}, ${max}]`,
      );
    }
    return id;
  }
}
