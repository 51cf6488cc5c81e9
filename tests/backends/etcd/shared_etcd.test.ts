/**
 * The test run's shared etcd (`IDALLOC_ETCD_TEST_SERVER`, set by the test launcher): a test
 * process's `sharedEtcd()` attaches to it instead of starting its own; an attached handle
 * compacts, refuses to kill or restart, and leaves the server running when closed.
 */
import assert from "node:assert/strict";
import {
  attachEtcd,
  ETCD_TEST_SERVER_ENV,
  etcdUnavailable,
  startEtcd,
} from "../../../src/backends/etcd/testing/cluster.ts";
import { rawClient } from "../../../src/backends/etcd/testing/fixture.ts";

const ignore = etcdUnavailable() !== undefined;
const FIXTURE = new URL("../../../src/backends/etcd/testing/fixture.ts", import.meta.url).href;

Deno.test({
  name: "shared etcd: a process named to it attaches; the handle refuses kill, keeps it running",
  ignore,
  async fn() {
    await using etcd = await startEtcd();
    const endpoint = etcd.endpoints[0];
    const script = `
      import { sharedEtcd } from ${JSON.stringify(FIXTURE)};
      const etcd = await sharedEtcd();
      const kill = await etcd.kill(0).then(() => "killed", (err) => err.message);
      console.log(JSON.stringify({ endpoints: etcd.endpoints, kill }));
      await etcd.close();`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["eval", script],
      env: { [ETCD_TEST_SERVER_ENV]: endpoint },
    }).output();
    const seen = JSON.parse(new TextDecoder().decode(out.stdout));
    assert.deepEqual(seen.endpoints, [endpoint], new TextDecoder().decode(out.stderr));
    assert.match(seen.kill, /kill\(\) on the test run's shared etcd: .*startEtcd\(\)/);

    const attached = attachEtcd(endpoint);
    await assert.rejects(attached.restart(0), /restart\(\) on the test run's shared etcd/);
    const raw = rawClient(etcd.endpoints);
    try {
      await raw.put("a").value("1");
      await raw.put("a").value("2");
      const revision = await attached.compact();
      assert.ok(revision >= 3, String(revision));
      await attached.close();
      assert.equal(await raw.get("a").string(), "2", "still serving after the handle closed");
    } finally {
      raw.close();
    }
    assert.throws(() => attachEtcd("https://127.0.0.1:1"), { name: "EtcdTestServerError" });
  },
});
