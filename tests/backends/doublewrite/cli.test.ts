// The CLI in Cilium's double-write modes (`--identity-allocation-mode doublewrite-… --store
// etcd://… --kubeconfig FILE`) on a private API server and its etcd: `identity allocate` in one
// mode, `identity get|list` in the other, `status` counting both sides; and
// the flag's usage errors.
import assert from "node:assert/strict";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import {
  kubeApiserverUnavailable,
  startKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { cli } from "../../cli/_run.ts";

const ignore = kubeApiserverUnavailable() !== undefined || etcdUnavailable() !== undefined;

Deno.test("CLI: --identity-allocation-mode needs the right stores", async () => {
  const usage = async (args: string[], message: RegExp) => {
    const r = await cli([...args, "status"]);
    assert.equal(r.code, 1, r.stderr);
    assert.match(r.stderr, message);
  };
  await usage(
    ["--store", "etcd://127.0.0.1:1", "--identity-allocation-mode", "doublewrite-readcrd"],
    /needs --kubeconfig FILE/,
  );
  await usage(
    ["--store", "kv:./x.kv", "--identity-allocation-mode", "doublewrite-readkvstore"],
    /needs --store etcd:\/\/…, not a deno-kv store/,
  );
  await usage(
    ["--store", "etcd://127.0.0.1:1", "--identity-allocation-mode", "crd"],
    /needs --store k8s:…/,
  );
  await usage(
    ["--store", "etcd://127.0.0.1:1", "--identity-allocation-mode", "readboth"],
    /must be kvstore, crd, doublewrite-readkvstore or doublewrite-readcrd/,
  );
});

Deno.test({
  name: "CLI: identity allocate|get|list and status in both double-write modes",
  ignore,
  async fn() {
    await using cluster = await startKubeApiServer();
    const kubeconfig = await cluster.kubeconfig("admin", { context: "test", namespace: "default" });
    const store = (mode: string) => [
      ...["--store", `etcd://${new URL(cluster.etcd.endpoints[0]).host}`],
      ...["--identity-allocation-mode", mode, "--kubeconfig", kubeconfig],
      ...["--context", "test", "--namespace", "default", "--lease-ttl", "3s", "--clock-skew", "1s"],
    ];
    const labels = ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"];
    const allocated = await cli([
      ...store("doublewrite-readkvstore"),
      ...["identity", "allocate", ...labels, "--json"],
    ]);
    assert.equal(allocated.code, 0, allocated.stderr);
    const { id } = JSON.parse(allocated.stdout) as { id: number };
    for (const mode of ["doublewrite-readkvstore", "doublewrite-readcrd"]) {
      const got = await cli([...store(mode), "identity", "get", String(id), "--json"]);
      assert.equal(got.code, 0, got.stderr);
      assert.match(got.stdout, /app=web/, `${mode}: get`);
      const listed = await cli([...store(mode), "identity", "list", "--json"]);
      assert.equal(listed.code, 0, listed.stderr);
      assert.match(listed.stdout, new RegExp(`${id}`), `${mode}: list`);
    }
    const status = await cli([...store("doublewrite-readcrd"), "status", "--json"]);
    assert.equal(status.code, 0, status.stderr);
    assert.deepEqual(JSON.parse(status.stdout).doubleWrite, {
      crd: { total: 1, only: 0 },
      kvstore: { total: 1, only: 0 },
      differing: [],
    });
    const human = await cli([...store("doublewrite-readkvstore"), "status"]);
    assert.match(human.stdout, /kvstore side +1 identities, 0 on the kvstore only/);
  },
});
