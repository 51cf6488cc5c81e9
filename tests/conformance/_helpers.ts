import assert from "node:assert/strict";
import { Allocator, type AllocatorOptions } from "../../mod.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";

export { eventually } from "../_support/eventually.ts";

/**
 * Short timings so lease expiry and periodic work happen within a test; no GC grace, so that two
 * `runGc()` passes back to back collect what is unused (the key-side tests set it where it
 * matters).
 */
export const FAST: Partial<AllocatorOptions> = {
  leaseTtlMs: 2_000,
  syncIntervalMs: 60_000,
  backoff: { initialMs: 5, maxMs: 100, factor: 2 },
  gcGraceMs: 0,
};

/** Opens an allocator for `node` on the fixture's store. */
export async function openNode(
  fx: StoreFixture,
  node: string,
  options: AllocatorOptions,
): Promise<Allocator> {
  const backend = await fx.backend(node, { fast: true });
  return await Allocator.open(backend, { ...FAST, ...options });
}

/**
 * The store's invariants, read directly from the store: every live reference of a
 * key carries the same ID, that ID's master maps to that key, and no two masters share a key that
 * has live references.
 */
export async function assertStoreInvariants(fx: StoreFixture): Promise<void> {
  // References first: a master is written with (or before) its first reference, so one written
  // between the two reads (an aborted call's write landing late) is seen whole or not at all.
  const refs = await fx.references();
  const masters = await fx.masters();
  const idOfKey = new Map<string, number>();
  for (const ref of refs) {
    if (!ref.live) continue;
    const seen = idOfKey.get(ref.key);
    assert.ok(
      seen === undefined || seen === ref.id,
      `key ${ref.key} has live references to two IDs: ${seen} and ${ref.id}`,
    );
    idOfKey.set(ref.key, ref.id);
    assert.equal(
      masters.get(ref.id),
      ref.key,
      `live reference ${ref.key}@${ref.node} → ${ref.id} has no matching master`,
    );
  }
}

/** `n` keys named like Cilium's tests. */
export function keys(n: number, prefix = "key"): string[] {
  return Array.from({ length: n }, (_, i) => `${prefix}${String(i + 1).padStart(4, "0")}`);
}
