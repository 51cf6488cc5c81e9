/**
 * The identity-create step, in one function: {@linkcode createMaster} is the only place an idalloc
 * node creates a `CiliumIdentity` — a new key's identity (`acquire.ts`) and a held key's missing
 * one re-created under the same ID (`ensure.ts`), each right after the node's own guarded write of
 * the key's claim (`claim.ts`). Creating the object by name is the allocation, as in Cilium's
 * `CRDBackend.AllocateID`: a second create of the name is refused (409), so a taken ID is an
 * answer, not a failure. {@linkcode identitiesOfKey} is the look before it where the informer may
 * lag: a consistent read of the identities carrying a key (Cilium's agents create without a claim,
 * so only the store shows theirs).
 *
 * It is kept apart as the seam for Cilium v1.17's double-write modes (`docs/kubernetes.md`,
 * "Later: Cilium v1.17's double-write modes"): there, the kvstore's master key of the same ID and key is written
 * right after this create succeeds, and the create undone when that write fails, by wrapping this
 * one step; the claim, the references and the informer stay as they are.
 *
 * @example
 * ```ts
 * import { createMaster, type MasterTarget } from "./master.ts";
 * import type { KubeClient } from "./kube.ts";
 *
 * // Needs an API server: a function here, so that the doc tests type-check it without calling it.
 * async function create(client: KubeClient, target: MasterTarget): Promise<boolean> {
 *   const master = { id: 300, key: "k8s:app=web;", epoch: "0a1b" };
 *   const created = await createMaster(client, target, master, AbortSignal.timeout(5_000));
 *   return created !== undefined; // false: ID 300 is taken
 * }
 * ```
 *
 * @module
 */
import { errorMessage, InvalidKeyError } from "../../errors.ts";
import type { K8sContext } from "./context.ts";
import { LEASE_NAMESPACE_ANNOTATION } from "./coordination.ts";
import { isStatus, type KubeClient, type KubeObject } from "./kube.ts";
import {
  CREATOR_ANNOTATION,
  identityObject,
  readIdentity,
  sanitizedLabels,
  securityLabelsOf,
} from "./layout.ts";
import { listAll } from "./paging.ts";

/** What {@linkcode createMaster} needs of the backend's context. */
export type MasterTarget = Pick<K8sContext, "identities" | "identityKind" | "node"> & {
  /** The coordination namespace, recorded on the identity (`coordination.ts`). */
  readonly namespace?: string;
};

/**
 * The identity to create: `id` for `key`, by this node under `epoch` (its reference goes to the
 * node's reference object first, `refs.ts`; the identity records its creator).
 */
export interface NewMaster {
  /** The ID: the object's name. */
  readonly id: number;
  /** The key: its `security-labels`. */
  readonly key: string;
  /** The epoch of this node's Lease: `idalloc.io/creator` is `<node>/<epoch>`. */
  readonly epoch: string;
}

/**
 * Creates identity `master.id` of `master.key`, recording its creator (see the module doc).
 * Returns the object as created, or `undefined` when the ID is taken (409: another identity has
 * the name). Throws {@linkcode InvalidKeyError} when the API server's validation refuses the
 * object (422, see {@linkcode identityRefused}); the client's errors otherwise.
 */
export async function createMaster(
  client: KubeClient,
  target: MasterTarget,
  master: NewMaster,
  signal: AbortSignal,
): Promise<KubeObject | undefined> {
  const obj = identityObject(target.identityKind, master.id, master.key, {
    [CREATOR_ANNOTATION]: creatorOf(target.node, master.epoch),
    ...(target.namespace === undefined ? {} : { [LEASE_NAMESPACE_ANNOTATION]: target.namespace }),
  });
  try {
    return await client.create(target.identities, obj, { signal });
  } catch (err) {
    if (isStatus(err, 422)) throw identityRefused(master.key, err);
    if (isStatus(err, 409)) return undefined;
    throw err;
  }
}

/**
 * The API server's validation refused an identity object of `key` (422): the key is one this
 * cluster cannot store (e.g. v1.20 API servers built with an older JSON decoder refuse an empty
 * label value in `security-labels`, which newer ones accept). Not retryable.
 */
export function identityRefused(key: string, err: unknown): InvalidKeyError {
  return new InvalidKeyError(
    `the API server refuses an identity of key '${key}': ${errorMessage(err)}`,
    { cause: err },
  );
}

/** The value of `idalloc.io/creator` for `node` under `epoch`. */
export function creatorOf(node: string, epoch: string): string {
  return `${node}/${epoch}`;
}

/**
 * The label selector that finds every identity of `key` (see {@linkcode identitiesOfKey}): the
 * key's labels as the identity's `metadata.labels` carry them, those with an empty value left out
 * (a selector of fewer labels still matches; it only lists more). `undefined`: the key has no such
 * label, and only a list of every identity finds its identities.
 */
export function keySelector(key: string): string | undefined {
  const parts = Object.entries(sanitizedLabels(securityLabelsOf(key)))
    .filter(([, value]) => value !== "")
    .map(([name, value]) => `${name}=${value}`)
    .sort();
  return parts.length === 0 ? undefined : parts.join(",");
}

/**
 * The identities carrying `key` in the store now, as objects: what to look at before creating one
 * when the informer's index may lag (`view_freshness.ts`). A list without `resourceVersion` is
 * consistent (read from etcd, not from the API server's watch cache, which may lag as the watch
 * does), narrowed by {@linkcode keySelector}: Cilium's agents label an identity with the same
 * `k8s:` labels (`SanitizeK8sLabels`), of which idalloc's rule keeps a subset. One round trip
 * unless the key has more than a page of identities (or no selectable label: every identity is
 * listed, paged).
 */
export async function identitiesOfKey(
  client: KubeClient,
  target: Pick<K8sContext, "identities">,
  key: string,
  signal: AbortSignal,
): Promise<KubeObject[]> {
  const labelSelector = keySelector(key);
  const { items } = await listAll(client, target.identities, {
    ...(labelSelector === undefined ? {} : { labelSelector }),
    signal,
  });
  return items.filter((obj) => {
    const read = readIdentity(obj);
    return read.ok && read.record.key === key;
  });
}
