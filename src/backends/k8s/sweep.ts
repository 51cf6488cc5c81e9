/**
 * The GC pass's sweep on Kubernetes (a writable session's `gcList`, after a complete listing), of
 * what nothing else removes:
 * - **stale claims**: a claim whose identity is gone (or carries another key), left by a GC that
 *   kept a claim written recently, or by an identity deleted by hand. Removed only once quiet
 *   (`claim.ts`: no node can be between writing it and creating its identity unconfirmed),
 *   judged at a time taken before the identities were listed, and guarded by its version.
 *
 * The sweep touches no identity, so the pass's candidates and their versions are unaffected.
 * Failures are logged; the next pass retries.
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import { claimQuiet, claimStaleness } from "./claim.ts";
import type { K8sContext } from "./context.ts";
import { isStatus, type KubeClient, type KubeObject } from "./kube.ts";
import { CLAIM_SELECTOR, claimName, type ClaimRecord, readClaim } from "./layout.ts";
import { LEASES } from "./options.ts";
import { listAll } from "./paging.ts";

const log = idallocLogger("k8s", "gc");

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
export async function sweepClaims(
  client: KubeClient,
  ctx: K8sContext,
  claims: readonly ClaimRecord[],
  signal: AbortSignal,
): Promise<number> {
  let removed = 0;
  for (const claim of claims) {
    try {
      const gone = await client.delete(LEASES, claim.name, {
        namespace: ctx.namespace,
        resourceVersion: claim.rv,
        signal,
      });
      if (gone) removed++;
    } catch (err) {
      if (!isStatus(err, 409)) throw err;
    }
  }
  if (removed > 0) log.info("removed {removed} stale key claims", { removed });
  return removed;
}
