/**
 * GC's collection of lapsed node Leases (a writable session's `gcList`, after a complete
 * listing), as Deno KV's GC removes its expired lease records: a node that exited holding
 * references leaves its Lease to lapse, and nothing else ever deletes it.
 *
 * Deleting a lapsed Lease changes no verdict: a reference is live only while its node's Lease is
 * live and carries its epoch, and a lapsed epoch never lives again (a node takes a new epoch
 * rather than renew a lease near its end), so its references stay dead and are swept or collected
 * with their identities. A live Lease is never deleted: each delete is guarded by the resource
 * version the Lease was judged at, so a renewal since refuses it (409), and a Lease without an
 * epoch or an end is the doctor's (`node-lease-undecodable`), not GC's.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { lapsedLeases } from "./lease_gc.ts";
 *
 * const lease = (node: string, expiresAt?: number) =>
 *   [node, { name: `idalloc-node-${node}`, node, epoch: "e1", expiresAt, rv: "1" }] as const;
 * const leases = new Map([lease("a", 10_000), lease("b", 20_000), lease("c")]);
 * assert.deepEqual(lapsedLeases(leases, 15_000, 1_000).map((l) => l.node), ["a"]);
 * ```
 *
 * @module
 */
import type { K8sContext } from "./context.ts";
import type { KubeClient } from "./kube.ts";
import type { NodeLeaseRecord } from "./layout.ts";
import { leaseLive } from "./liveness.ts";
import { deleteListedLeases } from "./sweep.ts";

/** The Leases of `leases` (ends on this process's clock) that have lapsed at `now`. */
export function lapsedLeases(
  leases: ReadonlyMap<string, NodeLeaseRecord>,
  now: number,
  maxClockSkewMs: number,
): NodeLeaseRecord[] {
  return [...leases.values()].filter((l) =>
    l.epoch !== undefined && l.expiresAt !== undefined && !leaseLive(l, now, maxClockSkewMs)
  );
}

/**
 * Deletes the node Leases of `leases` (as GC listed them) that have lapsed now, each guarded by
 * its listed resource version; returns how many went.
 */
export function sweepLeases(
  client: KubeClient,
  ctx: K8sContext,
  leases: ReadonlyMap<string, NodeLeaseRecord>,
  signal: AbortSignal,
): Promise<number> {
  const { now, maxClockSkewMs } = ctx.settings;
  return deleteListedLeases(
    client,
    ctx,
    lapsedLeases(leases, now(), maxClockSkewMs),
    "lapsed node Leases",
    signal,
  );
}
