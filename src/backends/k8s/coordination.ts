/**
 * The coordination namespace: where one identity store's node Leases and key claims live. It is a
 * property of the store, not of the caller: a fixed option whose default
 * ({@linkcode DEFAULT_NAMESPACE}) does not depend on the kubeconfig context or the pod, and every
 * identity an idalloc node writes a reference to records it (annotation
 * {@linkcode LEASE_NAMESPACE_ANNOTATION}). A caller configured with another namespace would judge
 * the references by Leases that are not theirs (calling live nodes dead) and miss the claims (one
 * key, two IDs): it is refused with {@linkcode CoordinationNamespaceError}, naming both and the
 * fix, before it judges or writes anything.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { foreignNamespace, LEASE_NAMESPACE_ANNOTATION } from "./coordination.ts";
 *
 * const obj = (ns?: string) => ({
 *   metadata: {
 *     name: "7",
 *     annotations: ns === undefined ? {} : { [LEASE_NAMESPACE_ANNOTATION]: ns } as Record<string, string>,
 *   },
 * });
 * assert.equal(foreignNamespace([obj(), obj("idalloc-system")], "idalloc-system"), undefined);
 * assert.deepEqual(foreignNamespace([obj("ops")], "idalloc-system"), { name: "7", namespace: "ops" });
 * ```
 *
 * @module
 */
import { IdallocError, type IdallocErrorOptions } from "../../errors.ts";
import { isStatus, type KubeObject } from "./kube.ts";

/**
 * The coordination namespace when none is given. A namespace of idalloc's own rather than
 * `kube-system`: RBAC cannot limit `create` to names, and idalloc's Lease names are per node and
 * per key, so a Role letting idalloc's nodes write their Leases in `kube-system` would let them
 * rewrite the leader-election Leases of the control plane and of Cilium's operator kept there.
 */
export const DEFAULT_NAMESPACE = "idalloc-system";

/** The annotation on an identity naming the namespace of the Leases its references live by. */
export const LEASE_NAMESPACE_ANNOTATION = "idalloc.io/lease-namespace";

/**
 * An identity of this store records another coordination namespace than the caller's: the caller
 * would judge its references by the wrong node Leases and miss the key claims. Not retryable:
 * configure every idalloc node and tool of the store with one namespace.
 */
export class CoordinationNamespaceError extends IdallocError {
  /** The caller's namespace. */
  readonly namespace: string;
  /** The namespace the store records. */
  readonly recorded: string;

  /**
   * Creates the error.
   *
   * @param namespace the caller's namespace
   * @param recorded the namespace the store records
   * @param identity the identity that records it (for the message)
   */
  constructor(namespace: string, recorded: string, identity: string) {
    super(
      `this store's node Leases and key claims are in namespace '${recorded}' (recorded on ` +
        `identity ${identity}), not '${namespace}' as configured here: give every idalloc ` +
        `node and tool of this store the same namespace (--namespace ${recorded}, or the ` +
        `option namespace: "${recorded}")`,
    );
    this.name = "CoordinationNamespaceError";
    this.namespace = namespace;
    this.recorded = recorded;
  }
}

/** The coordination namespace does not exist on the API server. Not retryable. */
export class NamespaceNotFoundError extends IdallocError {
  /** The namespace. */
  readonly namespace: string;

  /**
   * Creates the error.
   *
   * @param namespace the namespace
   * @param options the `cause` (the API server's 404)
   */
  constructor(namespace: string, options?: IdallocErrorOptions) {
    super(
      `namespace '${namespace}' (of idalloc's node Leases and key claims) does not exist: ` +
        `create it (kubectl create namespace ${namespace}) or name an existing one with ` +
        "--namespace (option namespace)",
      options,
    );
    this.name = "NamespaceNotFoundError";
    this.namespace = namespace;
  }
}

/**
 * The typed error when `err` is the API server's 404 for the namespace itself (a create in a
 * namespace that does not exist), else `undefined`.
 */
export function namespaceMissing(
  err: unknown,
  namespace: string,
): NamespaceNotFoundError | undefined {
  if (!isStatus(err, 404)) return undefined;
  const details = err.details;
  return details?.kind === "namespaces" && details.name === namespace
    ? new NamespaceNotFoundError(namespace, { cause: err })
    : undefined;
}

/** The coordination namespace an identity object records, if any. */
export function recordedNamespace(obj: Pick<KubeObject, "metadata">): string | undefined {
  const value = obj.metadata?.annotations?.[LEASE_NAMESPACE_ANNOTATION];
  return typeof value === "string" && value !== "" ? value : undefined;
}

/** The first of `objects` recording a namespace other than `namespace`, if any. */
export function foreignNamespace(
  objects: Iterable<Pick<KubeObject, "metadata">>,
  namespace: string,
): { readonly name: string; readonly namespace: string } | undefined {
  for (const obj of objects) {
    const recorded = recordedNamespace(obj);
    if (recorded !== undefined && recorded !== namespace) {
      return { name: String(obj.metadata?.name ?? ""), namespace: recorded };
    }
  }
  return undefined;
}

/** Throws {@linkcode CoordinationNamespaceError} when one of `objects` records another namespace. */
export function checkCoordination(
  objects: Iterable<Pick<KubeObject, "metadata">>,
  namespace: string,
): void {
  const foreign = foreignNamespace(objects, namespace);
  if (foreign !== undefined) {
    throw new CoordinationNamespaceError(namespace, foreign.namespace, foreign.name);
  }
}

/**
 * Throws {@linkcode CoordinationNamespaceError} when one of `records` (identities as read) records
 * another namespace than `namespace`.
 */
export function checkRecords(
  records: Iterable<{ readonly id: number; readonly leaseNamespace?: string }>,
  namespace: string,
): void {
  for (const r of records) {
    if (r.leaseNamespace !== undefined && r.leaseNamespace !== namespace) {
      throw new CoordinationNamespaceError(namespace, r.leaseNamespace, String(r.id));
    }
  }
}
