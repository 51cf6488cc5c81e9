/**
 * The GC pass's sweep on Kubernetes (a writable session's `gcList`, after a complete listing), of
 * what nothing else removes:
 * - **dead references on identities in use** (annotations of the layout before the nodes'
 *   reference objects, `refs.ts`): an identity that a live node or a `CiliumEndpoint` keeps is
 *   never collected, so the `ref.idalloc.io/<node>` annotations of nodes that are gone (their Lease lapsed, was deleted, or carries another epoch) would stay on
 *   it for good. Each is removed by a JSON patch that `test`s the dead epoch first: a reference
 *   that its node wrote again since (under a new epoch) fails the patch and stays. An epoch judged
 *   dead never lives again (a node never renews a lease near its end; it takes a new epoch), and
 *   the references were listed before the Leases they are judged by, so a dead value is dead for
 *   good. A node's own older-epoch reference is overwritten by its `ensure` anyway.
 * - **stale claims**: a claim whose identity is gone (or carries another key), left by a GC that
 *   kept a claim written recently, or by an identity deleted by hand. Removed only once quiet
 *   (`claim.ts`: no node can be between writing it and creating its identity unconfirmed),
 *   judged at a time taken before the identities were listed, and guarded by its version.
 *
 * Neither sweep touches an identity GC may collect (dead references go with the identity), so the
 * pass's candidates and their versions are unaffected. Failures are logged; the next pass retries.
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import { claimQuiet, claimStaleness } from "./claim.ts";
import type { K8sContext } from "./context.ts";
import { isStatus, type KubeClient, type KubeObject } from "./kube.ts";
import {
  CLAIM_SELECTOR,
  claimName,
  type ClaimRecord,
  type IdentityRecord,
  type NodeLeaseRecord,
  readClaim,
} from "./layout.ts";
import { refLive } from "./liveness.ts";
import { LEASES } from "./options.ts";
import { listAll } from "./paging.ts";
import { sweepPatch } from "./patch.ts";

const log = idallocLogger("k8s", "gc");

/** The dead references on `record`: node → epoch, judged on `leases` at `now`. */
export function deadReferences(
  record: Pick<IdentityRecord, "refs">,
  leases: ReadonlyMap<string, NodeLeaseRecord>,
  now: number,
  maxClockSkewMs: number,
): Map<string, string> {
  const dead = new Map<string, string>();
  for (const [node, epoch] of record.refs) {
    if (!refLive(epoch, leases.get(node), now, maxClockSkewMs)) dead.set(node, epoch);
  }
  return dead;
}

/**
 * The claims GC may remove: ours (the resource is hashed into the name), naming an ID within
 * `range` that `holders` shows without an identity or with one of another key (see
 * `claimStaleness`; ID → key, `null` for a damaged identity), and quiet at `listedAt`.
 */
export function removableClaims(
  claims: readonly KubeObject[],
  holders: ReadonlyMap<number, string | null>,
  range: { readonly min: number; readonly max: number },
  listedAt: number,
  ctx: Pick<K8sContext, "resourceName" | "settings">,
): ClaimRecord[] {
  return claims.flatMap((obj) => {
    const claim = readClaim(obj);
    if (claim === undefined || claimName(ctx.resourceName, claim.key) !== claim.name) return [];
    if (claim.id < range.min || claim.id > range.max) return [];
    if (claimStaleness(claim, holders.get(claim.id)) === undefined) return [];
    return claimQuiet(claim, listedAt, ctx.settings) ? [claim] : [];
  });
}

/** Removes the dead references of each identity (ID → node → epoch); returns how many went. */
export async function sweepReferences(
  client: KubeClient,
  ctx: K8sContext,
  dead: ReadonlyMap<number, ReadonlyMap<string, string>>,
  signal: AbortSignal,
): Promise<number> {
  let removed = 0;
  for (const [id, refs] of dead) {
    try {
      await client.patch(ctx.identities, String(id), sweepPatch(refs), { type: "json", signal });
      removed += refs.size;
      log.info("removed dead references of {nodes} from identity {id}", {
        nodes: [...refs.keys()],
        id,
      });
    } catch (err) {
      // 422: a reference was written again, or removed, since; 404: the identity is gone.
      if (!isStatus(err, 422) && !isStatus(err, 404)) throw err;
    }
  }
  return removed;
}

/** Every claim Lease of the namespace. */
export async function listClaims(
  client: KubeClient,
  ctx: K8sContext,
  signal: AbortSignal,
): Promise<KubeObject[]> {
  const { namespace } = ctx;
  return (await listAll(client, LEASES, { namespace, labelSelector: CLAIM_SELECTOR, signal }))
    .items;
}

/** Deletes `claims`, each guarded by its version as listed; returns how many went. */
export function sweepClaims(
  client: KubeClient,
  ctx: K8sContext,
  claims: readonly ClaimRecord[],
  signal: AbortSignal,
): Promise<number> {
  return deleteListedLeases(client, ctx, claims, "stale key claims", signal);
}

/**
 * Deletes Leases of the coordination namespace (key claims, node Leases), each guarded by the
 * version it was judged at: one renewed or replaced since (409) stays. Returns how many went.
 */
export async function deleteListedLeases(
  client: KubeClient,
  ctx: K8sContext,
  leases: Iterable<{ readonly name: string; readonly rv: string }>,
  what: string,
  signal: AbortSignal,
): Promise<number> {
  let removed = 0;
  for (const lease of leases) {
    try {
      const gone = await client.delete(LEASES, lease.name, {
        namespace: ctx.namespace,
        resourceVersion: lease.rv,
        signal,
      });
      if (gone) removed++;
    } catch (err) {
      if (!isStatus(err, 409)) throw err;
    }
  }
  if (removed > 0) log.info("removed {removed} {what}", { removed, what });
  return removed;
}
