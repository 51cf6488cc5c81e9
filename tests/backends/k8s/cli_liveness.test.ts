// The CLI on a real kube-apiserver where the cluster, not the protocol, decides: a user who may
// only read the identities runs `list`, `get`, `get-id` and `watch` (no Lease read or written);
// a coordination namespace that does not exist is one line naming it and the fix; and the default
// node name of a machine with a 60-character host name (a UTS namespace of its own) is valid.
import assert from "node:assert/strict";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { K8sStoreFixture } from "../../../src/backends/k8s/testing/fixture.ts";
import { main } from "../../../src/cli/main.ts";
import { MAX_NODE_NAME } from "../../../src/cli/node_name.ts";
import { Capture, cli, isOneLineError, ROOT } from "../../cli/_run.ts";

const ignore = kubeApiserverUnavailable() !== undefined;

/** The `--prefix` of a fixture's identity resource. */
function prefixOf(fx: K8sStoreFixture): string[] {
  return ["--prefix", `ciliumidentities.${fx.group}/v2`];
}

Deno.test({
  name:
    "k8s cli: a user who may only get, list and watch the identities runs list, get, get-id and watch",
  ignore,
  async fn() {
    await using fx = await K8sStoreFixture.create();
    const admin = fx.spec().cli;
    const { id } = JSON.parse(
      (await cli([...admin, "--node", "writer", "allocate", "app=web;", "--json"])).stdout,
    );
    await fx.cluster.grant("reader", [{
      apiGroups: [fx.group],
      resources: ["ciliumidentities"],
      verbs: ["get", "list", "watch"],
    }]);
    const kubeconfig = await fx.cluster.kubeconfig("reader", {
      context: "reader",
      namespace: fx.namespace,
    });
    const reader = [
      "--store",
      `k8s:${kubeconfig}`,
      "--context",
      "reader",
      "--namespace",
      fx.namespace,
      ...prefixOf(fx),
    ];
    const list = await cli([...reader, "list", "--json"]);
    assert.equal(list.code, 0, list.stderr);
    assert.deepEqual(JSON.parse(list.stdout), [{ id, key: "app=web;" }]);
    const get = await cli([...reader, "get", "app=web;"]);
    assert.equal(get.code, 0, get.stderr);
    assert.equal(get.stdout, `${id}\n`);
    assert.equal((await cli([...reader, "get-id", String(id)])).stdout, "app=web;\n");
    const none = await cli([...reader, "get", "app=none;"]);
    assert.equal(none.code, 3, none.stderr);

    const stop = new AbortController();
    const watcher = new Capture();
    const watching = main([...reader, "watch"], { ...watcher.io, signal: stop.signal });
    await watcher.waitFor((out) => out.includes('"synced"'));
    assert.match(watcher.stdout, new RegExp(`"id":${id}`));
    stop.abort();
    assert.equal(await watching, 0, watcher.stderr);

    // Writing still needs the Leases: refused at once, naming the rule to add.
    const write = await cli([...reader, "allocate", "app=db;"]);
    assert.equal(write.code, 1, write.stderr);
    assert.ok(isOneLineError(write.stderr), write.stderr);
    assert.match(write.stderr, /leases/);
  },
});

Deno.test({
  name: "k8s cli: a coordination namespace that does not exist is one line naming it and the fix",
  ignore,
  async fn() {
    await using fx = await K8sStoreFixture.create();
    const missing = `nope-${crypto.randomUUID().slice(0, 6)}`;
    const args = fx.spec().cli.map((a) => a === fx.namespace ? missing : a);
    const run = await cli([...args, "allocate", "app=web;"]);
    assert.equal(run.code, 1, run.stderr);
    assert.ok(isOneLineError(run.stderr), run.stderr);
    assert.match(
      run.stderr,
      new RegExp(
        `namespace '${missing}' .*does not exist: create it \\(kubectl create namespace ${missing}\\)`,
      ),
    );
  },
});

Deno.test({
  name:
    "k8s cli: the default node name on a host with a 60-character name is valid (a UTS namespace of its own)",
  ignore: ignore || Deno.build.os !== "linux" || Deno.uid() !== 0,
  async fn() {
    await using fx = await K8sStoreFixture.create();
    const host = "ip-172-31-10-200.eu-west-1.compute.internal".padEnd(60, "x");
    assert.equal(host.length, 60);
    const out = await new Deno.Command("unshare", {
      args: [
        "--uts",
        "--",
        "sh",
        "-c",
        'hostname "$0" && deno="$1" && shift && exec "$deno" run -A src/cli/main.ts "$@"',
        host,
        Deno.execPath(),
        ...fx.spec().cli,
        "allocate",
        "app=long;",
        "--json",
      ],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const text = new TextDecoder();
    assert.equal(out.code, 0, text.decode(out.stderr));
    const { id } = JSON.parse(text.decode(out.stdout));
    const refs: { node: string; id: number }[] = JSON.parse(
      (await cli([...fx.spec().cli, "refs", "--json"])).stdout,
    );
    const [ref] = refs.filter((r) => r.id === id);
    assert.ok(ref.node.length <= MAX_NODE_NAME, ref.node);
    // A readable prefix, the rest a hash of the whole host name.
    assert.match(ref.node, /^cli-ip-172-31-10-200\.eu-west-1\.compute\.[a-z]*-[0-9a-f]{8}-\d+-/);
  },
});
