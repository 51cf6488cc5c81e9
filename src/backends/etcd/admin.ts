/**
 * The etcd backend's {@linkcode BackendAdmin}, in Cilium's layout: references are
 * `<prefix>/value/<key>/<node>` bound to their node's etcd leases, so a stored reference is a live
 * one (etcd deletes a lease's keys when it expires) and a node's leases are found through its
 * references and its session's presence key (`presence.ts`).
 *
 * @module
 */
import type { IKeyValue } from "../../deps/etcd3.ts";
import type { BackendAdmin, NodeLease, StoredReference } from "../../allocator/admin.ts";
import { LiveEntryError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { bytes, type EtcdClient } from "./client.ts";
import { presentNodes, remainingSeconds } from "./presence.ts";
import { rangePages } from "./paging.ts";
import { type EtcdLayout, parseId } from "./layout.ts";
import { kvsAt, prefixRange, text } from "./txn.ts";

const log = idallocLogger("etcd");

/** The etcd implementation of {@linkcode BackendAdmin}. */
export class EtcdAdmin implements BackendAdmin {
  readonly #client: EtcdClient;
  readonly #layout: EtcdLayout;

  /**
   * @param client the backend's connection
   * @param layout Cilium's layout under the backend's prefix
   */
  constructor(client: EtcdClient, layout: EtcdLayout) {
    this.#client = client;
    this.#layout = layout;
  }

  get namespace(): string {
    return this.#layout.base;
  }

  async namespaceExists(signal: AbortSignal): Promise<boolean> {
    const client = this.#client;
    // Masters and references only: a session's presence key (`presence.ts`) stores no ID.
    const res = await client.call("list namespace", signal, (o) =>
      client.raw.kv.txn({
        compare: [],
        success: [this.#layout.masterRange, this.#layout.valuePrefix + "/"].map((p) => ({
          request_range: { ...prefixRange(p), limit: 1, keys_only: true },
        })),
        failure: [],
      }, o));
    return kvsAt(res.responses, 0).length > 0 || kvsAt(res.responses, 1).length > 0;
  }

  otherNamespaces(_signal: AbortSignal): Promise<string[]> {
    // etcd's keyspace is shared with everything else a cluster stores (Cilium's nodes, services,
    // …): scanning it for allocator layouts would be slow and guesswork.
    return Promise.resolve([]);
  }

  async nodeLeases(signal: AbortSignal): Promise<NodeLease[]> {
    const leasesOf = new Map<string, Set<string>>();
    const add = (node: string, lease: string) => {
      let set = leasesOf.get(node);
      if (set === undefined) leasesOf.set(node, set = new Set());
      if (lease !== "0") set.add(lease);
    };
    for await (const { node, lease } of this.#referenceEntries(signal)) add(node, lease);
    // A session that holds nothing yet is live all the same: its presence key says so.
    for await (const { node, lease } of presentNodes(this.#client, this.#layout, signal)) {
      if (lease !== "0") add(node, lease);
    }
    const ttl = new Map<string, number>();
    for (const lease of new Set([...leasesOf.values()].flatMap((s) => [...s]))) {
      ttl.set(lease, await remainingSeconds(this.#client, lease, signal));
    }
    const now = Date.now();
    const out: NodeLease[] = [];
    for (const [node, leases] of leasesOf) {
      const seconds = [...leases].map((l) => ttl.get(l) ?? -1);
      const longest = Math.max(-1, ...seconds);
      out.push({
        node,
        expiresAt: longest >= 0 ? now + longest * 1000 : undefined,
        // A reference without a lease (written by hand) never expires.
        live: longest > 0 || leases.size === 0,
      });
    }
    return out.sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  }

  async *references(signal: AbortSignal): AsyncGenerator<StoredReference> {
    for await (const { key, node, id } of this.#referenceEntries(signal)) {
      // etcd deletes a lease's keys when it expires: a stored reference is a live one.
      yield { key, node, id, live: true };
    }
  }

  /**
   * Deletes `node`'s reference to `key` only if it is bound to no lease: a stored reference on a
   * lease is live (etcd deletes a lease's keys when it ends), so deleting it would take the ID
   * from under a running node, which writes it back at its next sync anyway. Such a reference is
   * refused with {@linkcode LiveEntryError}; it goes with its lease when its node stops.
   */
  async deleteReference(key: string, node: string, signal: AbortSignal): Promise<boolean> {
    const client = this.#client;
    const refKey = bytes(this.#layout.refKey(key, node));
    const res = await client.call("delete reference", signal, (o) =>
      client.raw.kv.txn({
        compare: [{ key: refKey, target: "Lease", result: "Equal", lease: 0 }],
        success: [{ request_delete_range: { key: refKey } }],
        failure: [{ request_range: { key: refKey } }],
      }, o));
    if (res.succeeded) {
      return Number(res.responses[0]?.response_delete_range?.deleted ?? 0) > 0;
    }
    // The compare failed, so the reference exists on a lease (a missing key compares as lease 0).
    const held = kvsAt(res.responses, 0)[0];
    if (held === undefined) return false;
    const lease = BigInt(String(held.lease)).toString(16);
    throw new LiveEntryError(`node ${node}'s reference to '${key}' (on lease ${lease})`, [node]);
  }

  /** Every reference key under the prefix, parsed; corrupt ones are logged and skipped. */
  async *#referenceEntries(
    signal: AbortSignal,
  ): AsyncGenerator<{ key: string; node: string; id: number; lease: string }> {
    const layout = this.#layout;
    const range = prefixRange(layout.valuePrefix + "/");
    for await (const page of rangePages(this.#client, "list references", range, signal)) {
      for (const kv of page.kvs as IKeyValue[]) {
        const etcdKey = text(kv.key);
        const parts = layout.splitRefKey(etcdKey);
        if (parts === undefined || parts.key === "" || parts.node === "") {
          log.warning("skipping corrupt reference {etcdKey}: not <key>/<node>", { etcdKey });
          continue;
        }
        const id = parseId(text(kv.value));
        if (id === undefined) {
          log.warning("skipping corrupt reference {etcdKey}: the value is not an ID", { etcdKey });
          continue;
        }
        yield { ...parts, id, lease: String(kv.lease) };
      }
    }
  }
}
