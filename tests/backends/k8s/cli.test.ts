/**
 * The CLI on a Kubernetes store (`--store k8s:<kubeconfig>`), against the test process's private
 * kube-apiserver: every command in Cilium's CRD layout, and the failures users meet — no RBAC
 * rights, the CRD not installed, nothing listening, a server that is not Kubernetes, a missing
 * kubeconfig — each one line naming what to do, with the exit code of its class (by name).
 */
import assert from "node:assert/strict";
import { freePort } from "../../../src/backends/etcd/testing/cluster.ts";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { FIXTURE_CONTEXT, K8sStoreFixture } from "../../../src/backends/k8s/testing/fixture.ts";
import { main } from "../../../src/cli/main.ts";
import { Capture, cli, isOneLineError } from "../../cli/_run.ts";

const ignore = kubeApiserverUnavailable() !== undefined;

/** The error of a failed `--json` run. */
function jsonError(stderr: string): { code: number; name: string; message: string } {
  return JSON.parse(stderr).error;
}

Deno.test({
  name: "k8s cli: allocate, get, list, watch, status, refs, release, gc, doctor and identity",
  ignore,
  async fn() {
    await using fx = await K8sStoreFixture.create();
    const args = fx.spec().cli;
    const empty = await cli([...args, "list"]);
    assert.equal(empty.code, 0, empty.stderr);
    assert.match(empty.stderr, /note: nothing is stored under prefix ciliumidentities\./);

    // The watch prints the replay, `synced`, then live changes.
    const stopWatch = new AbortController();
    const watcher = new Capture();
    const watching = main([...args, "watch"], { ...watcher.io, signal: stopWatch.signal });
    await watcher.waitFor((out) => out.includes('"synced"'));

    // web is held by a running node until the test stops it; db's run ends at once.
    const stopWeb = new AbortController();
    const holder = new Capture();
    const holding = main([
      ...args,
      "--node",
      "web-node",
      "allocate",
      "app=web;",
      "--hold",
      "--json",
    ], {
      ...holder.io,
      signal: stopWeb.signal,
    });
    await holder.waitFor((out) => out.includes("\n"));
    const web = JSON.parse(holder.stdout.split("\n")[0]);
    const db = JSON.parse(
      (await cli([...args, "--node", "db-node", "allocate", "app=db;", "--json"])).stdout,
    );
    assert.equal(web.isNew, true);
    assert.equal((await cli([...args, "get", "app=web;"])).stdout, `${web.id}\n`);
    assert.equal((await cli([...args, "get-id", String(db.id)])).stdout, "app=db;\n");
    assert.equal((await cli([...args, "get", "app=none;"])).code, 3);
    assert.deepEqual(
      JSON.parse((await cli([...args, "list", "--json"])).stdout),
      [{ id: web.id, key: "app=web;" }, { id: db.id, key: "app=db;" }].sort((a, b) => a.id - b.id),
    );
    await watcher.waitFor((out) => out.includes(`"id":${db.id}`) && out.includes(`"id":${web.id}`));

    const status = JSON.parse((await cli([...args, "status", "--usage", "--json"])).stdout);
    assert.equal(status.backend, "k8s");
    assert.equal(status.ids, 2);
    assert.deepEqual(status.nodes.map((n: { node: string }) => n.node), ["db-node", "web-node"]);
    assert.ok(status.nodes.every((n: { live: boolean }) => n.live));
    assert.deepEqual(status.usage, { inUse: 2, unused: 0 });
    const refs = JSON.parse((await cli([...args, "refs", "--json"])).stdout);
    assert.deepEqual(
      refs.map((r: { node: string; id: number; live: boolean }) => [r.node, r.id, r.live]).sort(),
      [["db-node", db.id, true], ["web-node", web.id, true]].sort(),
    );

    // A live node's reference is never deleted; its own release (Ctrl-C of --hold) is.
    const refused = await cli([...args, "release", "app=web;", "--node", "web-node"]);
    assert.equal(refused.code, 4, refused.stderr);
    assert.match(refused.stderr, /is live until .*: its reference to app=web; \(ID \d+\) stays/);
    stopWeb.abort();
    assert.equal(await holding, 0);
    // On this store GC's grace is Cilium's heartbeat timeout: an identity created less than that
    // ago stays (a Cilium agent may be about to name it); --grace (or --gc-grace) overrides it.
    // The shared suites' store has no grace of its own (`--gc-grace 0s`); a user's has.
    assert.deepEqual(args.slice(-2), ["--gc-grace", "0s"]);
    const early = await cli([...args.slice(0, -2), "--lease-ttl", "2s", "gc"]);
    assert.equal(early.code, 0, early.stderr);
    assert.match(early.stdout, /^pass 1: 0 deleted, 0 unused \(marked\), \d+ remain\n/);
    assert.match(early.stdout, /\npass 2: 0 deleted, 0 unused \(marked\)/, "created < 30 min ago");
    assert.match(early.stderr, /note: this store keeps an ID created or marked less than 30m ago/);
    // Cilium's operator rule: the first pass marks (io.cilium.heartbeat), the second deletes.
    const gc = await cli([...args, "gc", "--grace", "0s", "--force", "--json"]);
    assert.equal(gc.code, 0, gc.stderr);
    const passes = gc.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(passes.map((p) => p.deleted), [[], [{ id: web.id, key: "app=web;" }]]);
    assert.equal((await cli([...args, "get", "app=web;"])).code, 3);
    assert.equal((await cli([...args, "get", "app=db;"])).stdout, `${db.id}\n`);
    await watcher.waitFor((out) => out.includes('"delete"'));
    stopWatch.abort();
    assert.equal(await watching, 0);

    // The doctor finds an identity no writer of this layout made, and removes it.
    await fx.corruptMaster(9_999);
    const found = await cli([...args, "doctor", "--json"]);
    assert.equal(found.code, 4, found.stderr);
    assert.deepEqual(
      JSON.parse(found.stdout).map((f: { kind: string }) => f.kind),
      ["master-undecodable"],
    );
    const fixed = await cli([...args, "doctor", "--fix"]);
    assert.equal(fixed.code, 0, fixed.stderr);
    assert.equal((await cli([...args, "doctor"])).code, 0);

    const identity = JSON.parse(
      (await cli([...args, "--node", "id-node", "identity", "allocate", "k8s:app=web", "--json"]))
        .stdout,
    );
    assert.equal(
      (await cli([...args, "get-id", String(identity.id)])).stdout,
      "k8s:app=web;\n",
      "the identity is stored as Cilium's label map",
    );
    const shown = await cli([...args, "identity", "get", String(identity.id)]);
    assert.equal(shown.code, 0, shown.stderr);
    assert.match(shown.stdout, /k8s:app=web/);
    const listed = JSON.parse((await cli([...args, "identity", "list", "--json"])).stdout);
    assert.ok(listed.some((i: { id: number }) => i.id === identity.id));
  },
});

Deno.test({
  name: "k8s cli: no RBAC rights, no CRD, no server, not Kubernetes: one line, exit code by name",
  ignore,
  async fn() {
    await using fx = await K8sStoreFixture.create();
    const prefix = `ciliumidentities.${fx.group}/v2`;
    const store = (kubeconfig: string) => [
      "--store",
      `k8s:${kubeconfig}`,
      "--context",
      FIXTURE_CONTEXT,
      "--prefix",
      prefix,
    ];
    const failing = async (args: string[], code: number) => {
      const human = await cli([...args, "list"]);
      assert.equal(human.code, code, human.stderr);
      assert.ok(isOneLineError(human.stderr), human.stderr);
      const json = await cli([...args, "list", "--json"]);
      assert.equal(json.code, code);
      return { human: human.stderr, json: jsonError(json.stderr) };
    };

    // A user without rights: the verb, the resource and the rule to add.
    const nobody = await fx.cluster.kubeconfig("nobody", {
      context: FIXTURE_CONTEXT,
      namespace: fx.namespace,
    });
    const denied = await failing(store(nobody), 1);
    assert.equal(denied.json.name, "StoreAccessDeniedError");
    assert.match(denied.human, /user "nobody" may not get, list, watch ciliumidentities\./);
    assert.doesNotMatch(denied.human, /--user|ETCD/, "no other backend's hint");
    assert.match(denied.human, /add the rule \{apiGroups: \["t[0-9a-f]+\.idalloc\.test"\]/);

    // The identity CRD is not installed under that group.
    const admin = fx.kubeconfig;
    const missing = await failing(
      [...store(admin).slice(0, 4), "--prefix", "ciliumidentities.absent.idalloc.test/v2"],
      1,
    );
    assert.equal(missing.json.name, "ResourceNotInstalledError");
    assert.match(missing.human, /ciliumidentities\.absent\.idalloc\.test/);

    // Nothing listens where the kubeconfig points.
    const port = await freePort();
    const closed = await Deno.makeTempFile({ suffix: ".yaml" });
    const notKube = await Deno.makeTempFile({ suffix: ".yaml" });
    const text = await Deno.readTextFile(admin);
    await Deno.writeTextFile(closed, text.replace(fx.cluster.server, `https://127.0.0.1:${port}`));
    await using server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      () => new Response("not here", { status: 404 }),
    );
    await Deno.writeTextFile(
      notKube,
      text.replace(fx.cluster.server, `http://127.0.0.1:${server.addr.port}`),
    );
    try {
      const refused = await failing(store(closed), 2);
      assert.equal(refused.json.name, "StoreConnectionRefusedError");
      const other = await failing(store(notKube), 1);
      assert.equal(other.json.name, "NotKubernetesApiError");
    } finally {
      await Deno.remove(closed);
      await Deno.remove(notKube);
    }

    // A kubeconfig that is not there.
    const none = await failing(store("/no/such/kubeconfig"), 1);
    assert.match(none.human, /\/no\/such\/kubeconfig/);
  },
});
