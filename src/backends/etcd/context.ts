/**
 * What the parts of an etcd session share: the connection, the layout, the node and its leases.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a connected client and lease manager (built by `EtcdBackend.openSession`)
 * const ctx: EtcdContext = { client, layout: new EtcdLayout("cilium/state/identities/v1"), node, leases };
 * ```
 *
 * @module
 */
import type { TxnBatcher } from "./batch.ts";
import type { EtcdClient } from "./client.ts";
import type { LeaseManager } from "./lease.ts";
import type { EtcdLayout } from "./layout.ts";

/** The shared state of one session. */
export interface EtcdContext {
  /** The backend's connection. */
  readonly client: EtcdClient;
  /** Cilium's key layout under the configured prefix. */
  readonly layout: EtcdLayout;
  /** This node's name (the last segment of its reference keys). */
  readonly node: string;
  /** The session's leases (absent work for read-only sessions). */
  readonly leases: LeaseManager;
  /** Whether writes also require Cilium's mutexes under `<prefix>/locks/` to be free. */
  readonly ciliumLocks: boolean;
  /** Group commit of the session's acquisitions and releases (see `batch.ts`). */
  readonly txns: TxnBatcher;
}
