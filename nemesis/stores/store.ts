/**
 * What the orchestrator does to and reads from a store, whatever the backend: parsed snapshots
 * for the checks, garbage planted next to valid data, a worker's lease revoked behind its back,
 * and entry counts for the growth run.
 *
 * @module
 */
import type { StoreSnapshot } from "../checks/store.ts";
import type { StoreSpec } from "../records.ts";

/** Garbage the suite plants under the prefix. Each kind is a fault of its own in the table. */
export const GARBAGE_KINDS = [
  "non-numeric-id",
  "empty-master",
  "bad-ref",
  "invalid-utf8",
  "oversized",
  "orphan-ref",
  "bad-index",
  "bad-counter",
] as const;

/** One kind of planted garbage. */
export type GarbageKind = typeof GARBAGE_KINDS[number];

/** Garbage only Deno KV's layout can hold (etcd's has no key index and no counters). */
export const KV_ONLY_GARBAGE: ReadonlySet<GarbageKind> = new Set(["bad-index", "bad-counter"]);

/** What planting wrote, for the report. */
export interface Planted {
  readonly kind: GarbageKind;
  /** The entries written, in a readable form. */
  readonly entries: readonly string[];
  /** IDs of masters it wrote that parse as valid ones: garbage the checks must not count as data. */
  readonly masterIds: readonly number[];
}

/** Where planted garbage may point: the key families and the ranges the workers use. */
export interface GarbageTargets {
  readonly keys: readonly string[];
  /** IDs the plain workers allocate from: garbage here collides with valid IDs. */
  readonly range: { readonly min: number; readonly max: number };
  readonly random: () => number;
}

/** A store under test. */
export interface NemesisStore extends AsyncDisposable {
  readonly kind: "kv" | "etcd";
  /** How child processes reach it. */
  readonly spec: StoreSpec;
  /** Garbage kinds this backend can hold. */
  readonly garbageKinds: readonly GarbageKind[];
  /** Reads and parses everything under the prefix (garbage is counted, not returned). */
  snapshot(): Promise<StoreSnapshot>;
  /** Plants one kind of garbage, never overwriting an entry that exists. */
  plant(kind: GarbageKind, targets: GarbageTargets): Promise<Planted>;
  /** Revokes `node`'s lease behind its back (etcd: the lease API; Deno KV: its lease record). */
  revokeLease(node: string): Promise<string>;
  /**
   * Entries under the prefix by category, for the growth run (Deno KV adds `feed written`: the
   * change-feed entries ever written, from the store's own counter).
   */
  counts(): Promise<Record<string, number>>;
}

/** A random ID in `range`, or (half the time) above it, where no worker allocates. */
export function garbageId(targets: GarbageTargets): number {
  const { min, max } = targets.range;
  return targets.random() < 0.5
    ? min + Math.floor(targets.random() * (max - min + 1))
    : max + 100_000 + Math.floor(targets.random() * 100_000);
}

/** A key of the families, picked with the targets' randomness. */
export function garbageKey(targets: GarbageTargets): string {
  return targets.keys[Math.floor(targets.random() * targets.keys.length)];
}
