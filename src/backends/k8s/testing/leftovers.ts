/**
 * What tests left on a shared test kube-apiserver, in one line: the CRDs, namespaces, Leases in
 * namespace `default` and objects of Cilium's own `ciliumidentities.cilium.io`. Fixtures isolate
 * themselves by a random CRD group and namespace each; an object in `default` or in Cilium's own
 * group is one that another test process could meet, so the launcher reports them after a run.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a running kube-apiserver; the launcher prints this after `deno task test`.
 * console.log(await leftovers(await sharedKubeApiServer()));
 * ```
 * @module
 */
import { DEFAULT_NAMESPACE } from "../coordination.ts";
import { LEASES } from "../options.ts";
import { listAll } from "../paging.ts";
import type { KubeTestCluster } from "./cluster.ts";
import { identityResource } from "./cluster.ts";
import { CRD_RESOURCE, NAMESPACE_RESOURCE } from "./crds.ts";

/** The names of `cluster`'s CRDs in Cilium's own group `cilium.io`. */
export async function ciliumCrdNames(cluster: KubeTestCluster): Promise<string[]> {
  await using client = await cluster.client("admin", "default");
  const { items } = await listAll(client, CRD_RESOURCE, { signal: AbortSignal.timeout(30_000) });
  return items.map((o) => String(o.metadata.name)).filter((n) => n.endsWith(".cilium.io")).sort();
}

/**
 * The one-line summary of what is on `cluster` besides a fresh server's objects; the CRDs of the
 * `pooled` groups (emptied fixture groups kept for reuse, `./crd_pool.ts`) are counted apart.
 */
export async function leftovers(
  cluster: KubeTestCluster,
  pooled: readonly string[] = [],
): Promise<string> {
  await using client = await cluster.client("admin", "default");
  const signal = AbortSignal.timeout(30_000);
  const names = async (resource: Parameters<typeof listAll>[1], namespace?: string) =>
    (await listAll(client, resource, { namespace, signal })).items.map((o) =>
      String(o.metadata.name)
    );
  // A fresh server has Cilium's CRDs (cilium.io) and the namespaces default, kube-* and idalloc's
  // default coordination namespace.
  const isPooled = (crd: string) => pooled.some((group) => crd.endsWith(`.${group}`));
  const fixtureCrds = (await names(CRD_RESOURCE)).filter((n) => !n.endsWith(".cilium.io"));
  const crds = fixtureCrds.filter((n) => !isPooled(n)).length;
  const kept = fixtureCrds.length - crds;
  const namespaces =
    (await names(NAMESPACE_RESOURCE)).filter((n) =>
      n !== "default" && n !== DEFAULT_NAMESPACE && !n.startsWith("kube-")
    ).length;
  const leases = (await names(LEASES, "default")).length +
    (await names(LEASES, DEFAULT_NAMESPACE)).length;
  const identities = (await names(identityResource())).length;
  return `${crds} CRDs (and ${kept} CRDs of ${pooled.length} emptied groups kept for reuse) and ` +
    `${namespaces} namespaces of fixtures; ${leases} Leases in default ` +
    `and ${DEFAULT_NAMESPACE}, ` +
    `and ${identities} ciliumidentities.cilium.io (objects every process sees)`;
}
