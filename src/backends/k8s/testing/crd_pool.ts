/**
 * The CRD groups of the Kubernetes test fixtures, reused across the fixtures of one test run.
 *
 * A fixture isolates its identities in a CRD group of its own (`t<random>.idalloc.test`: copies of
 * Cilium's `CiliumIdentity` and `CiliumEndpoint` CRDs, and `CiliumEndpointSlice` when a test asks
 * for it). Creating and deleting CRDs is what a kube-apiserver does worst: every change rebuilds
 * and re-serialises the whole aggregated OpenAPI document (v1.20: the apiextensions and aggregator
 * OpenAPI controllers), which a CPU profile of the run's shared server showed taking over half of
 * its CPU during the suite, the server being its largest consumer of CPU. So on the launcher's
 * shared server (`deno task test`) a fixture takes a group a finished fixture left empty, and
 * only creates one when none is free; on release it deletes the group's objects and gives the
 * group back, or deletes its CRDs when it cannot be sure the group is as a fresh one would be.
 *
 * The pool is a directory beside the launcher's server description (`crd-groups/`): a free group
 * is a file `<group>.free`; taking it renames the file (atomic: of two takers one gets
 * `ENOENT`), giving it back renames it again. A group of a process that died taken stays out of
 * the pool (the server ends with the run). Outside the launcher (a private server per process, or
 * a fixture's own server) every fixture creates and deletes its group as before.
 *
 * Fresh is what the tests may assume of a group: its CRDs as installed (`metadata.generation` 1,
 * not being deleted), and no object in it — no identity, no endpoint in any namespace, no slice.
 *
 * @example
 * ```ts ignore
 * // ignored: needs the launcher's kube-apiserver; the k8s fixtures use this.
 * const cluster = await sharedKubeApiServer();
 * await using client = await cluster.client("admin");
 * const fixtureGroup = await takeFixtureGroup(cluster, { pool: fixtureGroupPool() });
 * try {
 *   await client.create(fixtureGroup.identities, { metadata: { name: "7" } });
 * } finally {
 *   await fixtureGroup.release(client);
 * }
 * ```
 * @module
 */
import { randomBytes } from "node:crypto";
import { mkdirSync, readdirSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import process from "node:process";
import type { KubeClient, KubeResourceDescriptor } from "../client.ts";
import { listAll } from "../paging.ts";
import { KUBE_TEST_SERVER_ENV } from "./attach.ts";
import type { KubeTestCluster } from "./cluster.ts";
import { CRD_RESOURCE, endpointCrd, endpointSliceCrd } from "./crds.ts";

const FREE = ".free";

/** A group with more objects than this is not emptied one by one: its CRDs are deleted instead. */
const MAX_OBJECTS_TO_EMPTY = 500;

/** Deletes at once while emptying a group. */
const DELETE_CONCURRENCY = 8;

/** A fixture's CRD group (see the module doc). */
export interface FixtureGroup {
  /** The group, `t<random>.idalloc.test`. */
  readonly group: string;
  /** Its `CiliumIdentity` resource. */
  readonly identities: KubeResourceDescriptor;
  /** Its `CiliumEndpoint` resource (namespaced). */
  readonly endpoints: KubeResourceDescriptor;
  /** Its `CiliumEndpointSlice` resource, installed on the first call. */
  endpointSlices(): Promise<KubeResourceDescriptor>;
  /**
   * Ends the fixture's use of the group: empties it and gives it back to the pool, or deletes its
   * CRDs (not pooled, or not certainly fresh). Never throws: cleanup must not fail a test.
   */
  release(client: KubeClient): Promise<void>;
}

/** Options of {@linkcode takeFixtureGroup}. */
export interface TakeFixtureGroupOptions {
  /**
   * The pool to take from and give back to ({@linkcode fixtureGroupPool}), or `undefined` for a
   * group of the fixture's own: the pool belongs to the launcher's shared server (the fixtures
   * that use `sharedKubeApiServer()`), never to a server of a test's own.
   */
  readonly pool: string | undefined;
}

/**
 * The pool directory of the launcher's server whose description file is `server` (by default the
 * one this process was given), or `undefined` outside the launcher.
 */
export function fixtureGroupPool(
  server: string | undefined = process.env[KUBE_TEST_SERVER_ENV],
): string | undefined {
  return server ? join(dirname(server), "crd-groups") : undefined;
}

/** The groups free in `pool` now (the launcher's report counts their CRDs apart). */
export function pooledGroups(pool: string | undefined = fixtureGroupPool()): string[] {
  if (pool === undefined) return [];
  try {
    return readdirSync(pool).filter((f) => f.endsWith(FREE)).map((f) => f.slice(0, -FREE.length));
  } catch {
    return [];
  }
}

/** A group for one fixture on `cluster`: a free one of the pool, or a new one installed. */
export async function takeFixtureGroup(
  cluster: KubeTestCluster,
  options: TakeFixtureGroupOptions,
): Promise<FixtureGroup> {
  const { pool } = options;
  const taken = pool === undefined ? undefined : takeFree(pool);
  if (taken !== undefined) return fixtureGroup(cluster, taken.group, pool, taken.file);
  const group = `t${randomBytes(6).toString("hex")}.idalloc.test`;
  await cluster.installIdentityCrd(group);
  await cluster.installCrd(endpointCrd(group));
  let file: string | undefined;
  if (pool !== undefined) {
    mkdirSync(pool, { recursive: true });
    file = takenFile(pool, group);
    writeFileSync(file, "");
  }
  return fixtureGroup(cluster, group, pool, file);
}

/** Renames one free group's file to a taken one, or `undefined` when none is free. */
function takeFree(pool: string): { group: string; file: string } | undefined {
  for (const group of pooledGroups(pool)) {
    const file = takenFile(pool, group);
    try {
      renameSync(join(pool, group + FREE), file);
      return { group, file };
    } catch {
      // Another fixture took it between the listing and the rename.
    }
  }
  return undefined;
}

function takenFile(pool: string, group: string): string {
  return join(pool, `${group}.${process.pid}.${randomBytes(4).toString("hex")}.taken`);
}

function fixtureGroup(
  cluster: KubeTestCluster,
  group: string,
  pool: string | undefined,
  file: string | undefined,
): FixtureGroup {
  const identities: KubeResourceDescriptor = {
    group,
    version: "v2",
    plural: "ciliumidentities",
    namespaced: false,
    kind: "CiliumIdentity",
  };
  const endpoints: KubeResourceDescriptor = {
    group,
    version: "v2",
    plural: "ciliumendpoints",
    namespaced: true,
    kind: "CiliumEndpoint",
  };
  const slices: KubeResourceDescriptor = {
    group,
    version: "v2alpha1",
    plural: "ciliumendpointslices",
    namespaced: false,
    kind: "CiliumEndpointSlice",
  };
  let installingSlices: Promise<unknown> | undefined;
  return {
    group,
    identities,
    endpoints,
    async endpointSlices() {
      installingSlices ??= cluster.installCrd(endpointSliceCrd(group));
      await installingSlices;
      return slices;
    },
    async release(client) {
      const signal = AbortSignal.timeout(60_000);
      let fresh = false;
      if (pool !== undefined && file !== undefined) {
        fresh = await emptied(client, [identities, endpoints, slices], signal).catch(() => false);
      }
      if (fresh) {
        try {
          renameSync(file!, join(pool!, group + FREE));
          return;
        } catch {
          // The pool is gone (the run is ending): delete the CRDs as an unpooled fixture does.
        }
      }
      if (file !== undefined) rmSync(file, { force: true });
      // The API server deletes a deleted CRD's objects itself.
      await Promise.allSettled(
        [identities, endpoints, slices].map((r) =>
          client.delete(CRD_RESOURCE, `${r.plural}.${group}`, { signal })
        ),
      );
    },
  };
}

/**
 * Deletes every object of `resources` (in every namespace) and says whether the group is now as
 * fresh as a new one (see the module doc); `false` when a CRD was changed, is being deleted, or
 * holds too many objects to empty one by one.
 */
async function emptied(
  client: KubeClient,
  resources: readonly KubeResourceDescriptor[],
  signal: AbortSignal,
): Promise<boolean> {
  for (const resource of resources) {
    const crd = await client.get(CRD_RESOURCE, `${resource.plural}.${resource.group}`, { signal });
    if (crd === undefined) continue; // the slices' CRD, never installed
    const meta = crd.metadata as { generation?: number; deletionTimestamp?: string };
    if (meta.generation !== 1 || meta.deletionTimestamp !== undefined) return false;
    const everywhere = { signal, allNamespaces: true };
    const { items } = await listAll(client, resource, everywhere);
    if (items.length > MAX_OBJECTS_TO_EMPTY) return false;
    for (let i = 0; i < items.length; i += DELETE_CONCURRENCY) {
      await Promise.all(
        items.slice(i, i + DELETE_CONCURRENCY).map((obj) =>
          client.delete(resource, String(obj.metadata.name), {
            signal,
            ...(resource.namespaced ? { namespace: String(obj.metadata.namespace) } : {}),
          })
        ),
      );
    }
    // An object with a finalizer would linger: the group is fresh only when the list is empty.
    if ((await listAll(client, resource, everywhere)).items.length > 0) return false;
  }
  return true;
}
