/**
 * The access half of `KubeClient.probe`: for each resource the backend will use, a `list` with
 * `limit=1` (it proves at once that the resource is served and readable, with the caller's own
 * credentials) and a `SelfSubjectAccessReview` for each other verb (any authenticated user may
 * ask one: the `system:basic-user` role). All of a resource's missing verbs are named in one RBAC
 * rule, so that one edit fixes them. A resource marked `optional` that is not installed is
 * reported, not thrown (the CRD backend's `CiliumEndpoint`s: without Cilium there are none).
 *
 * @example
 * ```ts ignore
 * // ignored: needs an API server; tests/backends/k8s/client_failures.test.ts runs it for real.
 * const report = await client.probe([
 *   { resource: identities, verbs: ["get", "list", "watch", "create", "patch"] },
 *   { resource: endpoints, verbs: ["list"], allNamespaces: true, optional: true },
 * ], { timeoutMs: 5000 });
 * ```
 *
 * @module
 */
import { errorMessage } from "../../errors.ts";
import { NotIdentityResourceError, ResourceNotInstalledError } from "./errors.ts";
import { accessDenied, type KubeResource, type KubeVerb, resourceName } from "./failure.ts";

/** One resource the caller will use, and how. */
export interface ProbeTarget {
  /** The resource. */
  readonly resource: KubeResource;
  /** The verbs the caller will use on it. */
  readonly verbs: readonly KubeVerb[];
  /** The namespace of a namespaced resource. @default the client's namespace */
  readonly namespace?: string;
  /** Check the verbs in every namespace (a namespaced resource listed cluster-wide). */
  readonly allNamespaces?: boolean;
  /** Report the resource as missing instead of throwing when it is not installed. */
  readonly optional?: boolean;
  /**
   * The objects the resource must hold: of this kind, namespaced or not as the resource says.
   * Checked against the API server's discovery (`/apis/<group>/<version>`, readable by every
   * authenticated user) once the resource is known to be served; a mismatch throws
   * `NotIdentityResourceError`. Skipped when discovery does not answer.
   */
  readonly kind?: string;
}

/** What the probe found. */
export interface AccessReport {
  /** Optional resources that are not installed. */
  readonly missing: readonly KubeResource[];
}

/** What the probe needs of the client. */
export interface ProbedClient {
  /** The server URL. */
  readonly server: string;
  /** Where the settings came from. */
  readonly source: string;
  /** The default namespace. */
  readonly namespace: string;
  /** A list call. */
  list(
    res: KubeResource,
    options: { namespace?: string; allNamespaces?: boolean; limit?: number; signal?: AbortSignal },
  ): Promise<unknown>;
  /** A POST of JSON. */
  post(path: string, body: unknown, signal: AbortSignal): Promise<unknown>;
  /** The discovery document of a group version (`APIResourceList`). */
  discovery?(group: string, version: string, signal: AbortSignal): Promise<unknown>;
}

/** Whether the user of `client` may `verb` on `target` (a `SelfSubjectAccessReview`). */
async function allowed(
  client: ProbedClient,
  target: ProbeTarget,
  namespace: string | undefined,
  verb: KubeVerb,
  signal: AbortSignal,
): Promise<boolean> {
  const answer = await client.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
    apiVersion: "authorization.k8s.io/v1",
    kind: "SelfSubjectAccessReview",
    spec: {
      resourceAttributes: {
        group: target.resource.group,
        version: target.resource.version,
        resource: target.resource.plural,
        verb,
        ...(namespace !== undefined && { namespace }),
      },
    },
  }, signal) as { status?: { allowed?: unknown } };
  return answer.status?.allowed === true;
}

/**
 * Checks every target (see the module doc); throws the first problem as its typed error. Runs the
 * targets one after the other, and each target's reviews at once.
 */
export async function probeAccess(
  client: ProbedClient,
  targets: readonly ProbeTarget[],
  signal: AbortSignal,
): Promise<AccessReport> {
  const missing: KubeResource[] = [];
  for (const target of targets) {
    const { resource } = target;
    const namespace = !resource.namespaced || target.allNamespaces
      ? undefined
      : target.namespace ?? client.namespace;
    const denied: KubeVerb[] = [];
    let listError: unknown;
    try {
      await client.list(resource, {
        ...(namespace !== undefined && { namespace }),
        ...(target.allNamespaces && { allNamespaces: true }),
        limit: 1,
        signal,
      });
    } catch (err) {
      if (err instanceof ResourceNotInstalledError && target.optional) {
        missing.push(resource);
        continue;
      }
      if (!(err instanceof Error && err.name === "StoreAccessDeniedError")) throw err;
      // Without list rights the list cannot tell whether the resource is installed; the
      // reviews below still name what to grant.
      listError = err;
      if (target.verbs.includes("list")) denied.push("list");
    }
    if (target.kind !== undefined && listError === undefined) {
      await checkKind(client, target as ProbeTarget & { kind: string }, signal);
    }
    const others = target.verbs.filter((verb) => verb !== "list");
    const answers = await Promise.all(
      others.map((verb) => allowed(client, target, namespace, verb, signal)),
    );
    others.forEach((verb, i) => answers[i] || denied.push(verb));
    if (denied.length > 0) {
      throw accessDenied(
        {
          server: client.server,
          source: client.source,
          resource,
          ...(namespace !== undefined && { namespace }),
        },
        target.verbs.filter((verb) => denied.includes(verb)),
        userOf(listError),
        listError,
      );
    }
  }
  return { missing };
}

/** One entry of an `APIResourceList`. */
interface DiscoveredResource {
  readonly name?: unknown;
  readonly namespaced?: unknown;
  readonly kind?: unknown;
}

/**
 * Throws `NotIdentityResourceError` when discovery shows `target`'s resource namespaced where it
 * must not be (or the reverse), or holding objects of another kind than `target.kind`.
 */
async function checkKind(
  client: ProbedClient,
  target: ProbeTarget & { readonly kind: string },
  signal: AbortSignal,
): Promise<void> {
  const { resource } = target;
  let list: unknown;
  try {
    list = await client.discovery?.(resource.group, resource.version, signal);
  } catch (err) {
    if (signal.aborted) throw err;
    return; // discovery is a courtesy check: the list above proved the resource is served
  }
  const found = (list as { resources?: readonly DiscoveredResource[] } | undefined)?.resources
    ?.find((r) => r.name === resource.plural);
  if (found === undefined) return;
  const scoped = (namespaced: boolean) => namespaced ? "namespaced" : "cluster-scoped";
  if (found.namespaced === resource.namespaced && found.kind === target.kind) return;
  const name = `${resourceName(resource)}/${resource.version}`;
  throw new NotIdentityResourceError(
    `${name} on ${client.server} holds ${scoped(found.namespaced === true)} ` +
      `${String(found.kind)} objects, not ${scoped(resource.namespaced)} ${target.kind} ` +
      "objects: name an identity resource, Cilium's ciliumidentities.cilium.io/v2 or a CRD " +
      "with its schema (and that CRD's kind)",
    name,
  );
}

/** The user a 403 named (`user "bob" may not …`), if one did. */
function userOf(err: unknown): string | undefined {
  return err === undefined ? undefined : /^user "([^"]*)"/.exec(errorMessage(err))?.[1];
}
