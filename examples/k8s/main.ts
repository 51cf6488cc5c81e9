/**
 * `deno task k8s`: idalloc on Kubernetes, in Cilium's CRD layout. Two nodes agree on IDs for keys
 * and on a Cilium security identity for a label set; the example then shows the `CiliumIdentity`
 * object as Cilium's agents read it.
 *
 * Uses the cluster of `KUBECONFIG` (its current context; Cilium's `ciliumidentities.cilium.io` CRD
 * must be installed, and the user needs the RBAC rules of the README's Kubernetes section) if set,
 * else starts a private kube-apiserver on loopback when one is built (`.ci/kube-apiserver.sh`),
 * else explains and exits 0. On the user's cluster it removes the identities it made when it is
 * done (its node Leases lapse on their own).
 *
 * @module
 */
import { Allocator } from "@idalloc/idalloc";
import { IdentityAllocator, Labels } from "@idalloc/idalloc/identity";
import { createKubeClient, K8sBackend, loadKubeconfig } from "@idalloc/idalloc/k8s";
import { loadHarness, type PrivateServer } from "../../src/testing/harness.ts";
import { exitOnMistakes } from "../mistakes.ts";

exitOnMistakes("k8s");

let failed = false;
function check(condition: boolean, what: string): void {
  console.log(`  ${condition ? "✔" : "✘"} ${what}`);
  failed ||= !condition;
}

let server: PrivateServer | undefined;
let kubeconfig = Deno.env.get("KUBECONFIG")?.split(":")[0] || undefined;
if (kubeconfig === undefined) {
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
  console.log(`using the cluster of ${kubeconfig} (KUBECONFIG)`);
}

/** The nodes' allocator options: leases renewed every 5 s, well within the default skew. */
const LEASE = { leaseTtlMs: 15_000 };
const nodes: K8sBackend[] = [];
try {
  const connect = async (node: string) => {
    const backend = await K8sBackend.connect({ node, kubeconfig });
    nodes.push(backend);
    return backend;
  };
  const a = await connect("10.0.0.1");
  console.log(
    `\nidentities: ${a.resource} (one CiliumIdentity per ID); node Leases and key claims in ` +
      `namespace ${a.namespace}\n`,
  );

  console.log("1. two nodes, one ID per key");
  const keys = ["app=web;", "app=db;", "app=cache;"];
  {
    await using one = await Allocator.open(a, { ...LEASE, min: 256, max: 65535 });
    await using two = await Allocator.open(await connect("10.0.0.2"), {
      ...LEASE,
      min: 256,
      max: 65535,
    });
    for (const key of keys) {
      const first = await one.allocate(key);
      const second = await two.allocate(key);
      console.log(`  ${key} → ${first.id} on 10.0.0.1, ${second.id} on 10.0.0.2`);
      check(first.id === second.id, `both nodes answer ${first.id} for ${key}`);
    }
    for (const key of keys) {
      await one.release(key);
      await two.release(key);
    }
  }

  console.log("\n2. a Cilium security identity for a label set");
  const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
  let id: number;
  {
    await using one = await IdentityAllocator.open(await connect("10.0.0.3"), LEASE);
    await using two = await IdentityAllocator.open(await connect("10.0.0.4"), LEASE);
    const first = await one.allocate(labels);
    const second = await two.allocate(labels);
    id = first.identity.id;
    console.log(`  ${labels} → ${id} (isNew: ${first.isNew}), then ${second.identity.id}`);
    check(second.identity.id === id && !second.isNew, "the second node joins the same identity");

    // What a Cilium agent reads: the CiliumIdentity named by the ID.
    await using client = await createKubeClient(await loadKubeconfig(kubeconfig));
    const obj = await client.get(
      { group: "cilium.io", version: "v2", plural: "ciliumidentities", namespaced: false },
      String(id),
    );
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

  if (server === undefined) {
    // The user's cluster keeps what the example made unless GC takes it: mark, then delete.
    await using gc = await Allocator.open(await connect("10.0.0.5"), {
      ...LEASE,
      min: 256,
      max: 65535,
      gcGraceMs: 0,
    });
    let deleted = 0;
    for (let pass = 0; pass < 2; pass++) deleted += (await gc.runGc()).deleted;
    console.log(`\nremoved the example's ${deleted} identities`);
  }
} finally {
  for (const backend of nodes) await backend.close();
  await server?.close();
}
console.log(failed ? "\nsome checks failed" : "\nall checks passed");
if (failed) Deno.exit(1);
