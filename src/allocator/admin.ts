/**
 * The operator's view of a store, which every backend offers beside its sessions
 * (`Backend.admin()`): is anything stored under the namespace, which other namespaces does
 * the store hold, which nodes hold a lease, and every reference with its liveness. The CLI's
 * `status`, `refs` and `release` are built on it alone, so that a new backend brings its own answers
 * and the CLI needs no knowledge of its layout.
 *
 * Everything here only reads, except {@linkcode BackendAdmin.deleteReference}, which refuses what a
 * live node holds. None of it takes a lease or writes a lease record, so an operator never
 * disturbs a running node by looking.
 *
 * @example Live references of one key, and the keys whose references disagree
 * ```ts
 * import assert from "node:assert/strict";
 * import { DenoKvBackend } from "@idalloc/idalloc";
 * import { splitKeys } from "./admin.ts";
 *
 * using kv = await Deno.openKv(":memory:");
 * const admin = new DenoKvBackend(kv, { prefix: ["ids"], node: "operator" }).admin();
 * const signal = AbortSignal.timeout(5_000);
 * const refs = [];
 * for await (const ref of admin.references(signal)) refs.push(ref);
 * assert.equal(await admin.namespaceExists(signal), false);
 * assert.deepEqual(splitKeys(refs), []);
 * ```
 *
 * @module
 */

/** One node's lease as the store holds it. */
export interface NodeLease {
  /** The node's name. */
  readonly node: string;
  /**
   * When the lease ends (ms since the epoch): the node's own clock on Deno KV, the store's
   * remaining TTL on etcd. Undefined when the store cannot tell.
   */
  readonly expiresAt?: number;
  /** Whether references bound to it count as live now. */
  readonly live: boolean;
}

/** One node's reference to a key, as stored. */
export interface StoredReference {
  /** The encoded key. */
  readonly key: string;
  /** The node that references it. */
  readonly node: string;
  /** The ID the reference names (as stored, prefix mask included). */
  readonly id: number;
  /** Whether its lease is alive now (a dead one waits for GC or for the store to expire it). */
  readonly live: boolean;
}

/** A key whose live references name different IDs: a split made by another writer. */
export interface SplitKey {
  /** The encoded key. */
  readonly key: string;
  /** The IDs its live references name, ascending. */
  readonly ids: readonly number[];
  /** Its live references. */
  readonly references: readonly { readonly node: string; readonly id: number }[];
}

/** What a backend offers an operator. See the module documentation. */
export interface BackendAdmin {
  /** The namespace as an operator types it (`idalloc/demo`, `cilium/state/identities/v1`). */
  readonly namespace: string;
  /** Whether anything was ever stored under the namespace. */
  namespaceExists(signal: AbortSignal): Promise<boolean>;
  /**
   * Other namespaces this store holds, for "wrong prefix?" hints; empty when the backend cannot
   * tell cheaply. At most `limit` of them.
   */
  otherNamespaces(signal: AbortSignal, limit?: number): Promise<string[]>;
  /** Every node that holds a lease under the namespace, sorted by name. */
  nodeLeases(signal: AbortSignal): Promise<NodeLease[]>;
  /**
   * Every reference under the namespace, in the store's order (grouped by key), with its
   * liveness. Corrupt entries are logged and skipped.
   */
  references(signal: AbortSignal): AsyncIterable<StoredReference>;
  /**
   * Deletes `node`'s reference to the encoded `key`, without taking a lease in `node`'s name (a
   * lease record written for it would cut the running node's other references). Returns whether
   * a reference existed. Never deletes the reference of a live node (etcd: one bound to a lease,
   * which exists only while the lease lives; Deno KV: one whose node's lease record is live): that
   * throws {@linkcode LiveEntryError}, as it would take the ID from under a running node, which
   * writes the reference back at its next sync anyway. It is for what dead nodes left.
   */
  deleteReference(key: string, node: string, signal: AbortSignal): Promise<boolean>;
}

/**
 * The keys of `references` whose live references name more than one ID, sorted by key. Dead
 * references are ignored: GC removes them and they never decide a key's ID.
 */
export function splitKeys(references: Iterable<StoredReference>): SplitKey[] {
  const byKey = new Map<string, { node: string; id: number }[]>();
  for (const ref of references) {
    if (!ref.live) continue;
    let list = byKey.get(ref.key);
    if (list === undefined) byKey.set(ref.key, list = []);
    list.push({ node: ref.node, id: ref.id });
  }
  const out: SplitKey[] = [];
  for (const [key, refs] of byKey) {
    const ids = [...new Set(refs.map((r) => r.id))].sort((a, b) => a - b);
    if (ids.length > 1) out.push({ key, ids, references: refs });
  }
  return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}
