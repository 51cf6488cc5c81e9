/**
 * GC's collection of lapsed node Leases and of the reference objects of nodes that are not live
 * (a writable session's `gcList`, after a complete listing), as Deno KV's GC removes its expired
 * lease records: a node that exited holding references leaves its Lease to lapse and its reference
 * object (`refs.ts`) behind, and nothing else ever deletes them.
 *
 * A reference object is deleted when its node's Lease (listed after it) is missing or not live:
 * every reference in it is dead then, for good. The delete is guarded by the version the object
 * was listed at: a node that came back and wrote its object since keeps it (409); one that writes
 * after the delete finds it gone and creates it again with what it holds.
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
import type { NodeLeaseRecord, NodeRefsRecord } from "./layout.ts";
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
 * The reference objects of `objects` (listed before `leases`) whose node's Lease is missing or not
 * live at `now`: every reference in them is dead.
 */
export function deadReferenceObjects(
  objects: ReadonlyMap<string, NodeRefsRecord>,
  leases: ReadonlyMap<string, NodeLeaseRecord>,
  now: number,
  maxClockSkewMs: number,
): NodeRefsRecord[] {
  return [...objects.values()].filter((o) => !leaseLive(leases.get(o.node), now, maxClockSkewMs));
}

/**
 * Deletes the node Leases of `leases` (as GC listed them) that have lapsed now, and the reference
 * objects of `objects` whose node is not live, each guarded by its listed resource version;
 * returns how many went.
 */
export async function sweepLeases(
  client: KubeClient,
  ctx: K8sContext,
  leases: ReadonlyMap<string, NodeLeaseRecord>,
  objects: ReadonlyMap<string, NodeRefsRecord>,
  signal: AbortSignal,
): Promise<number> {
  const { now, maxClockSkewMs } = ctx.settings;
  const at = now();
  const dead = deadReferenceObjects(objects, leases, at, maxClockSkewMs);
  const lapsed = lapsedLeases(leases, at, maxClockSkewMs);
  return await deleteListedLeases(client, ctx, dead, "reference objects of dead nodes", signal) +
    await deleteListedLeases(client, ctx, lapsed, "lapsed node Leases", signal);
}
