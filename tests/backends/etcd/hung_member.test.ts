/**
 * A member that takes a request and never answers it — a write forwarded to a leader that just
 * died is dropped, and etcd says so only after its own timeout, longer than the client's — must
 * not cost the whole request timeout: the first attempt gets a part of it, and the request is
 * tried again on a member that answers. (After a stall this is what kept a fenced node silent for
 * seconds when the etcd leader was killed as it resumed.) A port that accepts connections and
 * never speaks stands in for that member, beside a real one.
 */
import assert from "node:assert/strict";
import { silentServer } from "../../_support/fake_servers.ts";
import { runCommand } from "../../_support/commands.ts";
import { etcdTest, namespace } from "./_helpers.ts";

etcdTest(
  "a member that never answers costs a part of each request's time, not all of it",
  async () => {
    await using ns = await namespace();
    await using silent = silentServer();
    await ns.raw.put(ns.layout.masterKey(7)).value("k8s:app=hung;");
    const out = await runCommand(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("./_hung_member_child.ts", import.meta.url).pathname,
        JSON.stringify({
          endpoints: [silent.url, ...ns.endpoints],
          prefix: ns.prefix,
          id: 7,
          // The members are tried in a random order: among 24 reads (and the connection's own
          // probe) some try the silent one first; all of them missing it has a chance of one in 16
          // million. Before, each of those failed: its one attempt waited out the whole timeout.
          reads: 24,
          requestTimeoutMs: 2_500,
        }),
      ],
    });
    assert.equal(out.stdout.trim(), "ok", out.stderr);
  },
);
