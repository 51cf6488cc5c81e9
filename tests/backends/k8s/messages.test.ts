/**
 * Messages of issue 35's item 10 on the real API server: a served resource that holds no
 * identities (Kubernetes' Leases, a namespaced CRD) named as the identity resource is refused when
 * the backend connects, in one line (the CLI: exit 1 at once, not "0 IDs" or retries); Cilium's
 * CRD not installed (or named with a version Cilium does not serve) names the CRD file that exists
 * in Cilium's source, once; the suite's skip message names the repository's own build script.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import { startKubeApiServer } from "../../../src/backends/k8s/testing/cluster.ts";
import { cli, isOneLineError, ROOT } from "../../cli/_run.ts";
import { deadline, fixture, k8sTest } from "./_helpers.ts";

k8sTest(
  "a served resource that holds no identities is refused at connect, naming Cilium's",
  async () => {
    await using fx = await fixture();
    const connect = (resource: { group: string; version: string; plural: string }) =>
      K8sBackend.connect(fx.options("n", { resource }), { client: fx.client, signal: deadline() });
    await assert.rejects(
      connect({ group: "coordination.k8s.io", version: "v1", plural: "leases" }),
      (err: Error & { resource?: string }) => {
        assert.equal(err.name, "NotIdentityResourceError");
        assert.equal(err.resource, "leases.coordination.k8s.io/v1");
        assert.match(
          err.message,
          /holds namespaced Lease objects, not cluster-scoped CiliumIdentity objects: name an identity resource, Cilium's ciliumidentities\.cilium\.io\/v2/,
        );
        assert.doesNotMatch(err.message, /\n/);
        return true;
      },
    );
    await assert.rejects(
      connect({ group: fx.group, version: "v2", plural: "ciliumendpoints" }),
      { name: "NotIdentityResourceError", message: /holds namespaced CiliumEndpoint objects/ },
    );
    // The fixture's own identity resource connects.
    await (await connect({ group: fx.group, version: "v2", plural: "ciliumidentities" })).close();
  },
);

k8sTest(
  "the CLI: a resource that is not an identity resource is one line and exit 1, for list and allocate",
  async () => {
    await using fx = await fixture();
    const kubeconfig = await fx.cluster.kubeconfig("admin", { namespace: fx.namespace });
    for (const prefix of ["leases.coordination.k8s.io/v1", `ciliumendpoints.${fx.group}/v2`]) {
      const args = ["--store", `k8s:${kubeconfig}`, "--prefix", prefix];
      for (const command of [["list"], ["allocate", "app=web;"]]) {
        const run = await cli([...args, ...command]);
        assert.equal(run.code, 1, run.stderr);
        assert.ok(isOneLineError(run.stderr), run.stderr);
        assert.match(run.stderr, /not cluster-scoped CiliumIdentity objects/);
        assert.match(run.stderr, /--prefix <plural>\.<group>\/<version>/);
      }
    }
  },
);

k8sTest(
  "Cilium's CRD not installed: one line naming its file in Cilium's source, once",
  async () => {
    // A server of its own without Cilium's CRDs (the run's shared one has them).
    await using cluster = await startKubeApiServer({ ciliumCrds: false });
    await using client = await cluster.client("admin");
    const connect = (version: string) =>
      K8sBackend.connect({ node: "n", resource: { version } }, { client, signal: deadline() });
    const err = await connect("v2").catch((e) => e);
    assert.equal(err.name, "ResourceNotInstalledError");
    assert.match(
      err.message,
      /does not serve ciliumidentities\.cilium\.io\/v2: install Cilium's CRD: kubectl apply -f pkg\/k8s\/apis\/cilium\.io\/client\/crds\/v2\/ciliumidentities\.yaml of Cilium's source/,
    );
    assert.equal(err.message.match(/install/g)?.length, 2, "one fix, said once");
    const v1 = await connect("v1").catch((e) => e);
    assert.match(
      v1.message,
      /Cilium serves ciliumidentities\.cilium\.io as v2, not v1: name ciliumidentities\.cilium\.io\/v2 .*crds\/v2\/ciliumidentities\.yaml/,
    );
    assert.doesNotMatch(v1.message, /crds\/v1/, "a directory Cilium does not have");

    const kubeconfig = await cluster.kubeconfig("admin", { namespace: "default" });
    const run = await cli(["--store", `k8s:${kubeconfig}`, "list"]);
    assert.equal(run.code, 1, run.stderr);
    assert.ok(isOneLineError(run.stderr), run.stderr);
    assert.match(
      run.stderr,
      /crds\/v2\/ciliumidentities\.yaml .*; or name an installed identity resource with --prefix/,
    );
    assert.equal(run.stderr.match(/install/g)?.length, 3, "install the CRD, or name one installed");
  },
);

Deno.test("the suite's skip message names the repository's build script", async () => {
  const home = await Deno.makeTempDir();
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "eval",
        `import { kubeApiserverUnavailable } from "${ROOT}src/backends/k8s/testing/cluster.ts";` +
        "console.log(kubeApiserverUnavailable());",
      ],
      cwd: ROOT,
      env: {
        HOME: home,
        KUBE_APISERVER: "",
        CI: "",
        DENO_DIR: Deno.env.get("DENO_DIR") ?? `${Deno.env.get("HOME")}/.cache/deno`,
      },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const said = new TextDecoder().decode(out.stdout) + new TextDecoder().decode(out.stderr);
    assert.match(said, /run `bash \.ci\/kube-apiserver\.sh`/);
    assert.doesNotMatch(said, /\.\.\/shared/);
    assert.ok(existsSync(`${ROOT}.ci/kube-apiserver.sh`));
  } finally {
    await Deno.remove(home, { recursive: true });
  }
});
