/**
 * Whether a node and its references are live, judged from the node's `Lease` as Deno KV's leases
 * are: a Lease is live until its end plus the clock-skew margin, and a reference is live while its
 * node's Lease is live **and** carries the reference's epoch. A node never renews a lease its own
 * clock says is within the margin of its end: it takes a new epoch, so references of the old
 * epoch are dead for every observer at once.
 *
 * A Lease's end is on the server's clock (`clock.ts`): its holder writes `renewTime` corrected by
 * the offset its writes measured, and the server's own time of the last renewal counts too (the
 * later of the two), so a holder whose clock is slow is never judged lapsed while it renews. The
 * judge reads the end on its own clock, corrected by the offset its own writes measured
 * ({@linkcode onLocalClock}; none measured: its clock as it is, within the margin).
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
 * Every node Lease in the namespace, by node, its end on this process's clock. A Lease whose name is not its holder's own (copied
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
    if (lease !== undefined && lease.name === nodeLeaseName(lease.node)) {
      out.set(lease.node, onLocalClock(lease, ctx.clock.offset));
    }
  }
  return out;
}

/**
 * `lease` with its end moved from the server's clock to this process's (`offset`: server − local),
 * so that judges compare it with their own `now`.
 */
export function onLocalClock(lease: NodeLeaseRecord, offset: number): NodeLeaseRecord {
  return lease.expiresAt === undefined || offset === 0
    ? lease
    : { ...lease, expiresAt: lease.expiresAt - offset };
}
