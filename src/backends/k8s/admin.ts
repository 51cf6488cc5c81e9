/**
 * The Kubernetes backend's {@linkcode BackendAdmin}: node Leases are the node leases; references
 * are the entries of the nodes' reference objects (`refs.ts`) and, from stores written before
 * them, the `ref.idalloc.io/<node>` annotations on the identities, each live while its node's
 * Lease is live and carries its epoch. Deleting one is a merge patch guarded by the version of the
 * object that carries it (the node's reference object, the identity), refused while the node's
 * Lease is live.
 *
 * @module
 */
import type { BackendAdmin, NodeLease, StoredReference } from "../../allocator/admin.ts";
import { LiveEntryError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { checkRecords } from "./coordination.ts";
import { isStatus } from "./kube.ts";
import { heldRemovalPatch, type IdentityRecord, readIdentity } from "./layout.ts";
import { leaseLive, readNodeLeases, refLive } from "./liveness.ts";
import { LEASES } from "./options.ts";
import { NODE_SELECTOR } from "./layout.ts";
import { listAll } from "./paging.ts";
import { dropReferencePatch } from "./patch.ts";
import { readReferenceObjects, referencesById, referencesOf, referencingNodes } from "./refs.ts";

const log = idallocLogger("k8s");

/** How often a reference deletion re-reads an identity that changed under it. */
const DELETE_ROUNDS = 3;

/** The store as an operator names it: `<plural>.<group>/<version>` (the CLI's `--prefix`). */
export function namespaceOf(ctx: K8sContext): string {
  return `${ctx.resourceName}/${ctx.settings.resource.version}`;
}

/** Every readable identity (one consistent list); damaged ones are logged and skipped. */
export async function readIdentities(
  ctx: K8sContext,
  signal: AbortSignal,
): Promise<IdentityRecord[]> {
  const { items } = await listAll(ctx.client, ctx.identities, { signal });
  const out: IdentityRecord[] = [];
  for (const obj of items) {
    const read = readIdentity(obj);
    if (read.ok) out.push(read.record);
    else {
      log.warning("skipping identity {name}: {reason}", {
        name: read.damage.name,
        reason: read.damage.reason,
      });
    }
  }
  return out;
}

/** The Kubernetes implementation of {@linkcode BackendAdmin}. */
export class K8sAdmin implements BackendAdmin {
  readonly #ctx: K8sContext;

  /** @param ctx the backend's context */
  constructor(ctx: K8sContext) {
    this.#ctx = ctx;
  }

  get namespace(): string {
    return namespaceOf(this.#ctx);
  }

  async namespaceExists(signal: AbortSignal): Promise<boolean> {
    const { client, identities, namespace } = this.#ctx;
    const [ids, leases] = await Promise.all([
      client.list(identities, { limit: 1, signal }),
      // A read-only user may read no Lease: then the identities alone tell.
      client.list(LEASES, { namespace, labelSelector: NODE_SELECTOR, limit: 1, signal })
        .catch((err) => {
          if (err instanceof Error && err.name === "StoreAccessDeniedError") return { items: [] };
          throw err;
        }),
    ]);
    return ids.items.length > 0 || leases.items.length > 0;
  }

  otherNamespaces(_signal: AbortSignal): Promise<string[]> {
    // Telling identity-shaped CRDs apart from the rest of a cluster's CRDs would be guesswork.
    return Promise.resolve([]);
  }

  async nodeLeases(signal: AbortSignal): Promise<NodeLease[]> {
    const leases = await readNodeLeases(this.#ctx, signal);
    const now = this.#ctx.settings.now();
    const skew = this.#ctx.settings.maxClockSkewMs;
    return [...leases.values()]
      .map((l) => ({
        node: l.node,
        ...(l.expiresAt === undefined ? {} : { expiresAt: l.expiresAt }),
        live: leaseLive(l, now, skew),
      }))
      .sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  }

  async *references(signal: AbortSignal): AsyncGenerator<StoredReference> {
    // Identities, then references, then Leases (as GC): every reference listed then predates the
    // Lease it is judged by.
    const records = await readIdentities(this.#ctx, signal);
    checkRecords(records, this.#ctx.namespace);
    const byId = referencesById((await readReferenceObjects(this.#ctx, signal)).values());
    const leases = await readNodeLeases(this.#ctx, signal);
    const now = this.#ctx.settings.now();
    const skew = this.#ctx.settings.maxClockSkewMs;
    records.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.id - b.id));
    for (const r of records) {
      const nodes = referencingNodes(
        referencesOf(r, byId),
        (node, epoch) => refLive(epoch, leases.get(node), now, skew),
      );
      for (const [node, live] of nodes) yield { key: r.key, node, id: r.id, live };
    }
  }

  /**
   * Removes `node`'s references to every identity of `key`: from its reference object (one merge
   * patch guarded by the object's version) and, from a store of the older layout, the annotations
   * on the identities (each guarded by the identity's version); refused with
   * {@linkcode LiveEntryError} while `node`'s Lease is live (whatever epoch its references name:
   * the node is there and would write them back).
   */
  async deleteReference(key: string, node: string, signal: AbortSignal): Promise<boolean> {
    const { client, identities, settings } = this.#ctx;
    let existed = false;
    for (let round = 0; round < DELETE_ROUNDS; round++) {
      const all = await readIdentities(this.#ctx, signal);
      // Judged by the wrong namespace's Leases, a live node would look dead.
      checkRecords(all, this.#ctx.namespace);
      const object = (await readReferenceObjects(this.#ctx, signal)).get(node);
      const ids = all.filter((r) => r.key === key && object?.refs.has(r.id)).map((r) => r.id);
      const records = all.filter((r) => r.key === key && r.refs.has(node));
      if (records.length === 0 && ids.length === 0) return existed;
      const lease = (await readNodeLeases(this.#ctx, signal)).get(node);
      if (leaseLive(lease, settings.now(), settings.maxClockSkewMs)) {
        throw new LiveEntryError(`node ${node}'s reference to '${key}'`, [node]);
      }
      let changed = false;
      const annotations = object && heldRemovalPatch(object, { ids: new Set(ids) });
      if (annotations !== undefined) {
        try {
          await client.patch(LEASES, object!.name, {
            metadata: { resourceVersion: object!.rv, annotations },
          }, { type: "merge", namespace: this.#ctx.namespace, signal });
          existed = true;
        } catch (err) {
          if (!isStatus(err, 409) && !isStatus(err, 404)) throw err;
          changed = true;
        }
      }
      for (const r of records) {
        try {
          await client.patch(identities, String(r.id), dropReferencePatch(r.rv, node), {
            type: "merge",
            signal,
          });
          existed = true;
        } catch (err) {
          if (!isStatus(err, 409) && !isStatus(err, 404)) throw err;
          changed = true;
        }
      }
      if (!changed) return existed;
    }
    return existed;
  }
}
