/**
 * Which node names have a live session on etcd: `<prefix>/nodes/<node>`, put on one of the
 * session's leases when it opens. etcd deletes the key when that lease ends (the process died, or
 * closed holding nothing and revoked it), so a stored key is a live session. References alone
 * cannot tell it: a node that holds nothing yet has none, and finding a node's references means
 * reading all of them.
 *
 * The claim is one transaction: put the key only if it is on no lease (absent), else read it. So of
 * two sessions opening one name at once, only one succeeds; the other is told who holds the name
 * ({@linkcode NodeInUseError}, with when the holder's lease lapses unless renewed). Cilium never
 * reads `<prefix>/nodes/`: its allocator lists `id/`, `value/` and `locks/` only.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a running etcd (tests/backends/etcd/node_in_use.test.ts runs it)
 * await claimNode(client, layout, "10.0.0.1", leaseId, { restart: false, signal });
 * ```
 *
 * @module
 */
import type { IKeyValue } from "../../deps/etcd3.ts";
import { NodeInUseError } from "../../errors.ts";
import { type EtcdClient, LeaseNotFound } from "./client.ts";
import { type EtcdLayout, goJoin } from "./layout.ts";
import { rangePages } from "./paging.ts";
import { kvsAt, prefixRange, put, read, text } from "./txn.ts";
import { bytes } from "./client.ts";

/** How often a claim reads a holder whose lease turned out to be ending, before giving up. */
const CLAIM_ATTEMPTS = 5;

/** `<prefix>/nodes/`: the start of every node's presence key. */
export function nodesPrefix(layout: EtcdLayout): string {
  return `${goJoin(layout.base, "nodes")}/`;
}

/** `<prefix>/nodes/<node>`, the node name as it is (never cleaned as a path). */
export function nodeKey(layout: EtcdLayout, node: string): string {
  return nodesPrefix(layout) + node;
}

/** The lease's remaining TTL in seconds, or -1 when etcd no longer knows it. */
export async function remainingSeconds(
  client: EtcdClient,
  lease: string,
  signal: AbortSignal,
): Promise<number> {
  try {
    const res = await client.call(
      "lease ttl",
      signal,
      (o) => client.raw.lease.leaseTimeToLive({ ID: lease }, o),
    );
    return Number(res.TTL);
  } catch (err) {
    if (err instanceof LeaseNotFound) return -1;
    throw err;
  }
}

/** Options of {@linkcode claimNode}. */
export interface ClaimOptions {
  /** Take the name over even while another session holds it (this process is that node restarting). */
  readonly restart: boolean;
  /** Aborts the claim. */
  readonly signal: AbortSignal;
}

/**
 * Puts `node`'s presence key on `lease`, if no other live session holds it (or `restart`). Throws
 * {@linkcode NodeInUseError} when one does; a key written by hand without a lease holds nothing.
 */
export async function claimNode(
  client: EtcdClient,
  layout: EtcdLayout,
  node: string,
  lease: string,
  options: ClaimOptions,
): Promise<void> {
  const key = nodeKey(layout, node);
  // What the key says is for operators reading etcd (`etcdctl get --prefix <prefix>/nodes/`).
  const value = JSON.stringify({ openedAt: new Date().toISOString() });
  let holder: { lease: string; expiresAt: number | undefined } | undefined;
  for (let attempt = 0; attempt < CLAIM_ATTEMPTS; attempt++) {
    const res = await client.call("claim node", options.signal, (o) =>
      client.raw.kv.txn({
        // A missing key compares as lease 0.
        compare: options.restart
          ? []
          : [{ key: bytes(key), target: "Lease", result: "Equal", lease: 0 }],
        success: [put(key, value, lease)],
        failure: [read(key)],
      }, o));
    if (res.succeeded) return;
    const held: IKeyValue | undefined = kvsAt(res.responses, 0)[0];
    if (held === undefined) continue;
    const holderLease = String(held.lease);
    const ttl = await remainingSeconds(client, holderLease, options.signal);
    // A lease that is ending takes its key with it: look again.
    holder = { lease: holderLease, expiresAt: ttl > 0 ? Date.now() + ttl * 1000 : undefined };
    if (ttl > 0) break;
  }
  throw new NodeInUseError(node, holder?.expiresAt);
}

/** Every node with a presence key under the prefix, with the key's lease (`"0"`: none). */
export async function* presentNodes(
  client: EtcdClient,
  layout: EtcdLayout,
  signal: AbortSignal,
): AsyncGenerator<{ node: string; lease: string }> {
  const prefix = nodesPrefix(layout);
  for await (const page of rangePages(client, "list nodes", prefixRange(prefix), signal)) {
    for (const kv of page.kvs as IKeyValue[]) {
      const node = text(kv.key).slice(prefix.length);
      if (node !== "" && !node.includes("/")) yield { node, lease: String(kv.lease) };
    }
  }
}
