/**
 * idalloc gives every node of a cluster the same small integer ID for the same key, backed by a
 * shared key-value store: Cilium's kvstore ID allocator, re-created for Deno.
 *
 * - {@linkcode Allocator}: allocate / release / look up IDs, a watch-fed cache, GC.
 * - {@linkcode DenoKvBackend}: the embedded default on Deno KV (also `@idalloc/idalloc/kv`).
 * - `@idalloc/idalloc/etcd`: the etcd backend. `@idalloc/idalloc/identity`: Cilium-style
 *   security identities on top.
 *
 * @example Three lines to a cluster-wide ID
 * ```ts
 * import assert from "node:assert/strict";
 * import { Allocator, DenoKvBackend } from "@idalloc/idalloc";
 *
 * using kv = await Deno.openKv(":memory:");
 * const backend = new DenoKvBackend(kv, { prefix: ["idalloc", "demo"], node: "node-a" });
 * await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *
 * const { id, isNew, firstUse } = await alloc.allocate("app=web;");
 * assert.ok(id >= 256 && id <= 65535);
 * assert.deepEqual([isNew, firstUse], [true, true]);
 * const { lastUse } = await alloc.release("app=web;");
 * assert.equal(lastUse, true);
 * ```
 *
 * @module
 */
export { Allocator, type AllocatorStatus } from "./src/allocator/allocator.ts";
export type { FenceReason, FenceStatus } from "./src/allocator/fence.ts";
export type { AllocationCounts } from "./src/telemetry/allocator.ts";
export {
  type AllocateResult,
  type AllocatorEvent,
  type AllocatorOptions,
  type BackoffOptions,
  type CacheValidator,
  type CallOptions,
  type GcRateLimit,
  type GcStats,
  type KeyCodec,
  type ReleaseResult,
  stringCodec,
} from "./src/allocator/types.ts";
export type * from "./src/allocator/backend.ts";
export * from "./src/errors.ts";
export {
  CORE_DAMAGE_KINDS,
  type CoreDamageKind,
  type DamageFinding,
  type DamageKind,
  type DamageScanOptions,
  type GcSkip,
  isStoreDoctor,
  type StoreDoctor,
  type ValidRanges,
} from "./src/allocator/damage.ts";
export {
  DenoKvBackend,
  type DenoKvBackendOptions,
  type KvU64Class,
} from "./src/backends/kv/mod.ts";
