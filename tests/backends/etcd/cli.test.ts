/**
 * The CLI against a private etcd on loopback: the same commands in Cilium's layout, and a store
 * that is down.
 */
import assert from "node:assert/strict";
import { etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import { sharedEtcd } from "../../../src/backends/etcd/testing/fixture.ts";
import { main } from "../../../src/cli/main.ts";
import { Capture, cli, isOneLineError } from "../../cli/_run.ts";

const ignore = etcdUnavailable() !== undefined;

async function etcdArgs(): Promise<string[]> {
  const etcd = await sharedEtcd();
  const hosts = etcd.endpoints.map((e) => e.replace("http://", "")).join(",");
  return ["--store", `etcd://${hosts}`, "--prefix", `idalloc-cli/${crypto.randomUUID()}`];
}

Deno.test({
  name: "etcd: allocate, get, list, release, gc and status",
  ignore,
  fn: async () => {
    const args = await etcdArgs();
    const empty = await cli([...args, "list"]);
    assert.equal(empty.code, 0, "an empty prefix is an empty list");
    assert.match(empty.stderr, /note: nothing is stored under prefix idalloc-cli\//);

    // web is held by a running node until the test stops it; db's run ends at once.
    const stopWeb = new AbortController();
    const holder = new Capture();
    const holding = main([...args, "allocate", "app=web;", "--hold", "--json"], {
      ...holder.io,
      signal: stopWeb.signal,
    });
    await holder.waitFor((out) => out.includes("\n"));
    const web = JSON.parse(holder.stdout.split("\n")[0]);
    const db = JSON.parse((await cli([...args, "allocate", "app=db;", "--json"])).stdout);
    assert.equal(web.isNew, true);
    assert.equal((await cli([...args, "get", "app=web;"])).stdout, `${web.id}\n`);
    assert.equal((await cli([...args, "get-id", String(db.id)])).stdout, "app=db;\n");
    assert.equal((await cli([...args, "get", "app=none;"])).code, 3);
    const list = JSON.parse((await cli([...args, "list", "--json"])).stdout);
    assert.deepEqual(
      list,
      [{ id: web.id, key: "app=web;" }, { id: db.id, key: "app=db;" }].sort((a, b) => a.id - b.id),
    );

    const status = JSON.parse((await cli([...args, "status", "--usage", "--json"])).stdout);
    assert.equal(status.backend, "etcd");
    assert.equal(status.ids, 2);
    assert.deepEqual(status.nodes.map((n: { node: string }) => n.node), [db.node, web.node].sort());
    assert.ok(status.nodes.every((n: { live: boolean }) => n.live));
    assert.notEqual(status.leader, null);
    assert.deepEqual(status.usage, { inUse: 2, unused: 0 });

    // A live node's reference is never deleted; its own release (Ctrl-C of --hold) is.
    const refused = await cli([...args, "release", "app=web;", "--node", web.node]);
    assert.equal(refused.code, 4, refused.stderr);
    assert.match(
      refused.stderr,
      /is live until \S+ \(in \d+s\): its reference to app=web; \(ID \d+\) stays/,
    );
    stopWeb.abort();
    assert.equal(await holding, 0);
    const gc = await cli([...args, "gc", "--grace", "0s", "--force", "--json"]);
    assert.equal(gc.code, 0, gc.stderr);
    const passes = gc.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(passes.map((p) => p.deleted), [[], [{ id: web.id, key: "app=web;" }]]);
    assert.equal((await cli([...args, "get", "app=web;"])).code, 3);
    assert.equal((await cli([...args, "get", "app=db;"])).stdout, `${db.id}\n`);

    const identity = JSON.parse(
      (await cli([...args, "identity", "allocate", "k8s:app=web", "--json"])).stdout,
    );
    assert.equal(
      (await cli([...args, "get-id", String(identity.id)])).stdout,
      "k8s:app=web;\n",
      "the identity is stored in Cilium's kvstore format",
    );
  },
});

Deno.test({
  name: "etcd: a wrong TLS file is a usage error",
  ignore,
  fn: async () => {
    const args = await etcdArgs();
    const result = await cli([...args, "--ca", "/no/such/ca.pem", "list"]);
    assert.equal(result.code, 1);
    assert.match(result.stderr, /cannot read --ca file \/no\/such\/ca\.pem/);
    assert.ok(isOneLineError(result.stderr));
    const half = await cli([...args, "--cert", "/x.pem", "list"]);
    assert.equal(half.code, 1);
    assert.match(half.stderr, /--cert and --key go together/);
  },
});
