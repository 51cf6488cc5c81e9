/**
 * `deno task k8s`: idalloc on Kubernetes, in Cilium's CRD layout. Two nodes agree on IDs for keys
 * and on a Cilium security identity for a label set; the example then shows the `CiliumIdentity`
 * object as Cilium's agents read it.
 *
 * Uses the cluster of the kubeconfig kubectl would use when `KUBECONFIG` is set (its current
 * context; Cilium's `ciliumidentities.cilium.io` CRD must be installed, and the user needs the RBAC
 * rules of docs/operations.md's RBAC section), else starts a private kube-apiserver on loopback when
 * one is built (`.ci/kube-apiserver.sh`), else explains and exits 0.
 *
 * It touches only what it made. Every run has its own tag: its keys start with
 * `idalloc-example-<tag>/`, its label set carries `k8s:idalloc.io/example-run=<tag>` (so its
 * identity is new, never one of Cilium's), and its nodes are `idalloc-example-<tag>-<n>`. When it
 * is done — or on Ctrl-C or SIGTERM, then exiting 130 — it deletes exactly those identities (each
 * guarded by its resource version, and only while no other node references it), the claims of its
 * keys and its nodes' Leases, and says how many. It never runs GC: GC judges every identity of the
 * cluster, Cilium's included.
 *
 * @module
 */
import { Allocator } from "@idalloc/idalloc";
import { IdentityAllocator, Labels } from "@idalloc/idalloc/identity";
import { K8sBackend, type KubeClient, type KubeObject } from "@idalloc/idalloc/k8s";
import { loadHarness, type PrivateServer } from "../../src/testing/harness.ts";
import { exitIfInterrupted, onInterrupt } from "../interrupt.ts";
import { exitOnMistakes } from "../mistakes.ts";

exitOnMistakes("k8s");
const interrupted = onInterrupt("k8s");

let failed = false;
function check(condition: boolean, what: string): void {
  console.log(`  ${condition ? "✔" : "✘"} ${what}`);
  failed ||= !condition;
}

/** This run's tag: its keys, label set and node names carry it (see the module doc). */
const tag = crypto.randomUUID().slice(0, 8);
const KEY_PREFIX = `idalloc-example-${tag}/`;
const RUN_LABEL = "idalloc.io/example-run";
const nodeName = (n: number) => `idalloc-example-${tag}-${n}`;
/** Where node Leases and key claims live. */
const LEASES = {
  group: "coordination.k8s.io",
  version: "v1",
  plural: "leases",
  namespaced: true,
} as const;

let server: PrivateServer | undefined;
let kubeconfig: string | undefined;
if (!Deno.env.get("KUBECONFIG")) {
  // The repository's Kubernetes harness starts a private API server where one is built.
  server = await (await loadHarness("k8s")).server?.();
  if (server?.kubeconfig === undefined) {
    console.log(
      "skipped: no Kubernetes API server. Set KUBECONFIG to a cluster's kubeconfig, or build a " +
        "private kube-apiserver (bash .ci/kube-apiserver.sh) and run `deno task k8s` again.",
    );
    Deno.exit(0);
  }
  kubeconfig = server.kubeconfig;
  console.log(`started a private kube-apiserver at ${server.endpoints[0]}`);
} else {
  // No path: the library reads the kubeconfig kubectl would (KUBECONFIG, else ~/.kube/config).
  console.log("using the cluster of KUBECONFIG (its current context)");
}

/** The nodes' allocator options: leases renewed every 5 s, well within the default skew. */
const LEASE = { leaseTtlMs: 15_000 };
const nodes: K8sBackend[] = [];
const connect = async (n: number) => {
  const backend = await K8sBackend.connect({
    node: nodeName(n),
    ...(kubeconfig === undefined ? {} : { kubeconfig }),
  }, { signal: interrupted });
  nodes.push(backend);
  return backend;
};
let operator: K8sBackend | undefined;
try {
  operator = await connect(0);
  console.log(
    `\nidentities: ${operator.resource} (one CiliumIdentity per ID); node Leases and key ` +
      `claims in namespace ${operator.namespace}\nthis run touches only what it makes: keys ` +
      `${KEY_PREFIX}…, identities labelled ${RUN_LABEL}=${tag}, nodes ${nodeName(0)}…\n`,
  );
  await run(interrupted);
} catch (err) {
  // What fails once the run is interrupted is the interruption's doing.
  if (!interrupted.aborted) throw err;
} finally {
  for (const backend of nodes.slice(1)) await backend.close();
  if (operator !== undefined) await cleanUp(operator);
  await operator?.close();
  await server?.close();
}
exitIfInterrupted(interrupted);
console.log(failed ? "\nsome checks failed" : "\nall checks passed");
if (failed) Deno.exit(1);

async function run(signal: AbortSignal): Promise<void> {
  console.log("1. two nodes, one ID per key");
  const keys = ["app=web;", "app=db;", "app=cache;"].map((k) => KEY_PREFIX + k);
  {
    await using one = await Allocator.open(await connect(1), { ...LEASE, min: 256, max: 65535 });
    await using two = await Allocator.open(await connect(2), { ...LEASE, min: 256, max: 65535 });
    for (const key of keys) {
      const first = await one.allocate(key, { signal });
      const second = await two.allocate(key, { signal });
      console.log(`  ${key} → ${first.id} on ${nodeName(1)}, ${second.id} on ${nodeName(2)}`);
      check(first.id === second.id, `both nodes answer ${first.id} for ${key}`);
    }
    for (const key of keys) {
      await one.release(key);
      await two.release(key);
    }
  }

  console.log("\n2. a Cilium security identity for a label set");
  const labels = Labels.parse([
    "k8s:app=web",
    "k8s:io.kubernetes.pod.namespace=prod",
    `k8s:${RUN_LABEL}=${tag}`,
  ]);
  {
    await using one = await IdentityAllocator.open(await connect(3), LEASE);
    await using two = await IdentityAllocator.open(await connect(4), LEASE);
    const first = await one.allocate(labels, { signal });
    const second = await two.allocate(labels, { signal });
    const id = first.identity.id;
    console.log(`  ${labels} → ${id} (isNew: ${first.isNew}), then ${second.identity.id}`);
    check(second.identity.id === id && !second.isNew, "the second node joins the same identity");

    // What a Cilium agent reads: the CiliumIdentity named by the ID.
    const obj = await operator!.client.get(identities(operator!), String(id), { signal });
    console.log(`  kubectl get ciliumidentity ${id}:`);
    console.log(`    security-labels: ${JSON.stringify(obj?.["security-labels"])}`);
    console.log(`    metadata.labels: ${JSON.stringify(obj?.metadata.labels)}`);
    check(
      (obj?.["security-labels"] as Record<string, string> | undefined)?.["k8s:app"] === "web",
      "the object carries the label set as Cilium's security-labels",
    );
    await one.release(first.identity);
    await two.release(second.identity);
  }
}

/** The identity resource of `backend` (`<plural>.<group>`, served as v2). */
function identities(backend: K8sBackend) {
  const dot = backend.resource.indexOf(".");
  return {
    group: backend.resource.slice(dot + 1),
    version: "v2",
    plural: backend.resource.slice(0, dot),
    namespaced: false,
  } as const;
}

/** Whether `obj` is an identity this run made: its key or label set carries the run's tag. */
function ours(obj: KubeObject): boolean {
  const labels = obj["security-labels"] as Record<string, unknown> | undefined;
  const key = labels?.["idalloc:key"];
  return labels?.[`k8s:${RUN_LABEL}`] === tag ||
    (typeof key === "string" && key.startsWith(KEY_PREFIX));
}

/** Whether `key` (as a claim carries it) is one of this run's: its prefix, or its label set. */
function ourKey(key: string): boolean {
  return key.startsWith(KEY_PREFIX) || key.includes(`k8s:${RUN_LABEL}=${tag};`);
}

/** References on `obj` of nodes that are not this run's (they keep the identity). */
function foreignReferences(obj: KubeObject): string[] {
  return Object.keys(obj.metadata.annotations ?? {})
    .filter((a) => a.startsWith("ref.idalloc.io/"))
    .map((a) => a.slice("ref.idalloc.io/".length))
    .filter((node) => !node.startsWith(`idalloc-example-${tag}-`));
}

/** Deletes `name` if still at `resourceVersion`; whether it did. */
async function guardedDelete(
  client: KubeClient,
  res: typeof LEASES | ReturnType<typeof identities>,
  obj: KubeObject,
  namespace?: string,
): Promise<boolean> {
  try {
    return await client.delete(res, String(obj.metadata.name), {
      resourceVersion: String(obj.metadata.resourceVersion),
      ...(namespace === undefined ? {} : { namespace }),
      signal: AbortSignal.timeout(10_000),
    });
  } catch (err) {
    if ((err as { code?: number }).code === 409) return false; // changed meanwhile: not ours now
    throw err;
  }
}

/**
 * Removes what this run made, and only that (see the module doc): its identities, the claims of
 * its keys, its nodes' Leases. Says what it removed, and what it left.
 */
async function cleanUp(operator: K8sBackend): Promise<void> {
  const { client, namespace } = operator;
  const signal = AbortSignal.timeout(20_000);
  try {
    let removed = 0;
    const left: string[] = [];
    for (const obj of (await client.list(identities(operator), { signal })).items.filter(ours)) {
      const others = foreignReferences(obj);
      if (others.length > 0) left.push(`${obj.metadata.name} (referenced by ${others.join(", ")})`);
      else if (await guardedDelete(client, identities(operator), obj)) removed++;
    }
    const leases = (await client.list(LEASES, {
      namespace,
      labelSelector: "app.kubernetes.io/managed-by=idalloc",
      signal,
    })).items;
    let claims = 0;
    let nodeLeases = 0;
    for (const lease of leases) {
      const key = lease.metadata.annotations?.["idalloc.io/key"];
      const holder = (lease.spec as { holderIdentity?: unknown } | undefined)?.holderIdentity;
      const role = lease.metadata.labels?.["idalloc.io/role"];
      if (role === "claim" && typeof key === "string" && ourKey(key)) {
        if (await guardedDelete(client, LEASES, lease, namespace)) claims++;
      } else if (
        role === "node" && typeof holder === "string" &&
        holder.startsWith(`idalloc-example-${tag}-`)
      ) {
        if (await guardedDelete(client, LEASES, lease, namespace)) nodeLeases++;
      }
    }
    console.log(
      `\nremoved what this run made, and nothing else: ${removed} identities, ${claims} key ` +
        `claims, ${nodeLeases} node Leases` +
        (left.length === 0 ? "" : `; left identities other nodes use: ${left.join("; ")}`),
    );
  } catch (err) {
    failed = true;
    console.error(`cleaning up failed: ${err instanceof Error ? err.message : err}`);
    console.log(
      `left what this run made: identities labelled ${RUN_LABEL}=${tag} or with keys ` +
        `${KEY_PREFIX}…, Leases of nodes idalloc-example-${tag}-… in namespace ${namespace}`,
    );
  }
}
