/**
 * Whether a node and its references are live, judged from the node's `Lease` on wall clocks, as
 * Deno KV's leases are: a Lease is live until `renewTime + leaseDurationSeconds` plus the
 * clock-skew margin (its `renewTime` is its holder's clock, which may lag the observer's), and a
 * reference is live while its node's Lease is live **and** carries the reference's epoch. A node
 * never renews a lease its own clock says is within the margin of its end: it takes a new epoch,
 * so references of the old epoch are dead for every observer at once.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { leaseLive, refLive } from "./liveness.ts";
 * const lease = { name: "idalloc-node-a", node: "a", epoch: "e1", expiresAt: 10_000, rv: "1" };
 * assert.equal(leaseLive(lease, 14_999, 5_000), true);
 * assert.equal(leaseLive(lease, 15_000, 5_000), false);
 * assert.equal(refLive("e1", lease, 12_000, 5_000), true);
 * assert.equal(refLive("e0", lease, 12_000, 5_000), false);
 * ```
 *
 * @module
 */
import type { K8sContext } from "./context.ts";
import { countedClient, type Tally } from "./kube.ts";
import { NODE_SELECTOR, nodeLeaseName, type NodeLeaseRecord, readNodeLease } from "./layout.ts";
import { listAll } from "./paging.ts";
import { LEASES } from "./options.ts";

/** Whether `lease` is live at `now` (see the module doc). */
export function leaseLive(
  lease: NodeLeaseRecord | undefined,
  now: number,
  maxClockSkewMs: number,
): boolean {
  return lease?.expiresAt !== undefined && now < lease.expiresAt + maxClockSkewMs;
}

/** Whether a reference with `epoch` is live under its node's `lease` at `now`. */
export function refLive(
  epoch: string,
  lease: NodeLeaseRecord | undefined,
  now: number,
  maxClockSkewMs: number,
): boolean {
  return lease?.epoch === epoch && leaseLive(lease, now, maxClockSkewMs);
}

/**
 * Every node Lease in the namespace, by node. A Lease whose name is not its holder's own (copied
 * or hand-made) never speaks for the node.
 */
export async function readNodeLeases(
  ctx: K8sContext,
  signal: AbortSignal,
  tally?: Tally,
): Promise<Map<string, NodeLeaseRecord>> {
  const { items } = await listAll(countedClient(ctx.client, tally), LEASES, {
    namespace: ctx.namespace,
    labelSelector: NODE_SELECTOR,
    signal,
  });
  const out = new Map<string, NodeLeaseRecord>();
  for (const obj of items) {
    const lease = readNodeLease(obj);
    if (lease !== undefined && lease.name === nodeLeaseName(lease.node)) out.set(lease.node, lease);
  }
  return out;
}
