/**
 * What the parts of an etcd session share: the connection, the layout, the node and its leases.
 *
 * @example
 * ```ts ignore
 * const core: SessionCore = { client, layout: new EtcdLayout("cilium/state/identities/v1"), node, leases };
 * ```
 *
 * @module
 */
import type { EtcdClient } from "./client.ts";
import type { LeaseManager } from "./leases.ts";
import type { EtcdLayout } from "./paths.ts";

/** The shared state of one session. */
export interface SessionCore {
  /** The backend's connection. */
  readonly client: EtcdClient;
  /** Cilium's key layout under the configured prefix. */
  readonly layout: EtcdLayout;
  /** This node's name (the last segment of its reference keys). */
  readonly node: string;
  /** The session's leases (absent work for read-only sessions). */
  readonly leases: LeaseManager;
}
