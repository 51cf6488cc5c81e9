/**
 * Ctrl-C on the examples (issue 28, items 3 and 12): the cluster example interrupted with SIGINT
 * stops its node processes and removes its temporary directory, as a finished run does, and exits
 * 130; a node process whose parent is gone ends even while it is stuck in an allocation (it watches
 * its stdin from its first moment: its parent holds the other end).
 */
import assert from "node:assert/strict";
import { etcdUnavailable } from "../../src/backends/etcd/testing/cluster.ts";
import { rawClient, sharedEtcd } from "../../src/backends/etcd/testing/fixture.ts";
import { EtcdLayout } from "../../src/backends/etcd/layout.ts";
import { nodeKey } from "../../src/backends/etcd/presence.ts";
import { ChildOutput } from "../_support/child_output.ts";
import { eventually } from "../_support/eventually.ts";
import { processesWith } from "../_support/processes.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
/** Far beyond what stopping takes (a few seconds): only a hang reaches it. */
const HANG_MS = 45_000;

/** The child's exit status, or `undefined` if it has not exited within `ms` (then it is killed). */
async function exited(
  child: Deno.ChildProcess,
  ms: number,
): Promise<Deno.CommandStatus | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<undefined>((
    resolve,
  ) => (timer = setTimeout(() => resolve(undefined), ms)));
  try {
    const status = await Promise.race([child.status, late]);
    if (status === undefined) child.kill("SIGKILL");
    return status;
  } finally {
    clearTimeout(timer);
  }
}

Deno.test({
  name: "demo interrupted with SIGINT: nodes stopped, temporary directory removed, exit 130",
  ignore: Deno.build.os !== "linux",
  fn: async () => {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "examples/cluster/main.ts"],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const output = new ChildOutput(child, "demo");
    let dir: string | undefined;
    try {
      // The node processes are spawned (they allocate next: the run is far from its end).
      await output.until("1. 4 node processes");
      dir = /Deno KV file (\S+)\/ids\.kv/.exec(output.text)?.[1];
      assert.ok(dir, output.text);
      assert.equal(processesWith(dir).length, 4, "the node processes run");
      child.kill("SIGINT");
      const status = await exited(child, HANG_MS);
      await output.toEnd();
      const stderr = await output.stderr;
      assert.ok(status, `the demo did not end:\n${output.text}\n${stderr}`);
      assert.equal(status.code, 130, stderr);
      assert.match(stderr, /cluster: SIGINT: stopping the node processes and cleaning up/);
      // The demo waited for its nodes: none is left, and so is nothing of the directory.
      assert.deepEqual(processesWith(dir), []);
      await assert.rejects(Deno.stat(dir), Deno.errors.NotFound, `${dir} was left behind`);
    } finally {
      output.kill();
      for (const pid of dir ? processesWith(dir) : []) Deno.kill(pid, "SIGKILL");
      await child.status;
      await output.toEnd().catch(() => {});
      await output.stderr;
      if (dir) await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

Deno.test({
  name: "a cluster node stuck in an allocation ends when its parent goes (its stdin closes)",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    const etcd = await sharedEtcd();
    const prefix = `t/${crypto.randomUUID()}/cilium/state/identities/v1`;
    const layout = new EtcdLayout(prefix);
    const raw = rawClient(etcd.endpoints);
    // A Cilium node's mutex on the key: the allocation waits for it (up to a minute).
    await raw.put(`${layout.keyLockPath("app=web;")}/694d7a1b2c3d4e5f`).value("");
    const store = { kind: "etcd", endpoints: etcd.endpoints, prefix };
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "examples/cluster/node.ts", JSON.stringify(store), "node-a", "app=web;"],
      cwd: ROOT,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const output = new ChildOutput(child, "node-a");
    try {
      // The node opened (its name is claimed) and now waits on the mutex in `allocate`.
      await eventually(
        async () => (await raw.get(nodeKey(layout, "node-a")).string()) !== null,
        "node-a opened its allocator",
        30_000,
      );
      // What its parent's end does when the parent dies.
      await child.stdin.close();
      const status = await exited(child, HANG_MS);
      await output.toEnd();
      assert.ok(status, `node-a outlived its parent:\n${await output.stderr}`);
      assert.equal(output.text, "", "it allocated nothing");
    } finally {
      output.kill();
      await child.status;
      await output.toEnd().catch(() => {});
      await output.stderr;
      await raw.delete().prefix(`t/${prefix.split("/")[1]}/`);
      raw.close();
    }
  },
});
