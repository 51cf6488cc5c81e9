/**
 * The Deno KV backend of idalloc: {@linkcode DenoKvBackend}.
 *
 * Data layout (tuple keys under the configured prefix `P`):
 *
 * | Key | Value | Expiry |
 * |---|---|---|
 * | `[...P, "id", N]` | master `{ key }` | none |
 * | `[...P, "key", k]` | key index `{ id }`, same commit and versionstamp as its master | none |
 * | `[...P, "touch", k]` | `Deno.KvU64`, +1 on every acquire (what GC deletes check) | none |
 * | `[...P, "ref", k, node]` | reference `{ id, lease }` | none (dead ones are GC'd) |
 * | `[...P, "lease", node]` | `{ lease, expiresAt }` | ttl + 2 × clock skew (backstop only) |
 * | `[...P, "log", ms, node, nonce]` | change feed `{ id, key \| null }` | log retention |
 * | `[...P, "gen"]` | `Deno.KvU64`, number of change-feed entries | none |
 *
 * A reference is live while its node's lease record carries the same lease id and has not passed
 * `expiresAt` (plus the clock-skew margin); expired records that the store has not swept yet
 * count as dead. Watches follow the change feed (woken by `kv.watch` in-process, by polling
 * across processes), so their cost is proportional to the changes.
 *
 * @example Two nodes on one KV file
 * ```ts
 * import assert from "node:assert/strict";
 * import { Allocator } from "@idalloc/idalloc";
 * import { DenoKvBackend } from "@idalloc/idalloc/kv";
 *
 * using kv = await Deno.openKv(":memory:");
 * await using a = await Allocator.open(
 *   new DenoKvBackend(kv, { prefix: ["ids"], node: "node-a" }),
 *   { max: 1000 },
 * );
 * await using b = await Allocator.open(
 *   new DenoKvBackend(kv, { prefix: ["ids"], node: "node-b" }),
 *   { max: 1000 },
 * );
 * const first = await a.allocate("app=web;");
 * const second = await b.allocate("app=web;");
 * assert.equal(second.id, first.id);
 * assert.deepEqual([first.isNew, second.isNew], [true, false]);
 * ```
 *
 * @module
 */
export { DenoKvBackend } from "./backend.ts";
export type { DenoKvBackendOptions, KvU64Class } from "./options.ts";
export type * from "../../allocator/backend.ts";
export type * from "../../allocator/damage.ts";
