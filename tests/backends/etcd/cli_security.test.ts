/**
 * The CLI's etcd security flags end to end: `--ca/--cert/--key/--tls-server-name` against a
 * private etcd demanding client certificates, and `--user/--password` (also from the environment).
 */
import assert from "node:assert/strict";
import { etcdUnavailable, startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { enableAuth } from "../../_support/etcd_auth.ts";
import { etcdTls, hasOpenssl, SERVER_NAME, withCerts } from "../../_support/tls.ts";
import { cli, isOneLineError } from "../../cli/_run.ts";

const ignore = etcdUnavailable() !== undefined;

Deno.test({
  name: "etcd: mutual TLS through --ca/--cert/--key/--tls-server-name",
  ignore: ignore || !hasOpenssl(),
  fn: async () => {
    await withCerts("idalloc-cli-tls-", async (files) => {
      await using etcd = await startEtcd({ tls: etcdTls(files, { mutual: true }) });
      const host = etcd.endpoints[0].replace("https://", "");
      const base = ["--store", `etcd://${host}`, "--prefix", "cli-tls", "--ca", files.ca];
      const tls = [
        ...base,
        "--cert",
        files.clientCert,
        "--key",
        files.clientKey,
        "--tls-server-name",
        SERVER_NAME,
      ];
      const allocated = await cli([...tls, "allocate", "app=web;", "--json"]);
      assert.equal(allocated.code, 0, allocated.stderr);
      const { id } = JSON.parse(allocated.stdout);
      assert.equal((await cli([...tls, "get-id", String(id)])).stdout, "app=web;\n");
      // Without the client certificate the server refuses: a setup mistake, the user's to fix.
      const refused = await cli([
        ...base,
        "--tls-server-name",
        SERVER_NAME,
        "--connect-timeout",
        "1s",
        "list",
      ]);
      assert.equal(refused.code, 1, refused.stderr);
      assert.ok(isOneLineError(refused.stderr), refused.stderr);
      assert.match(refused.stderr, /client certificate.*give --cert and --key/);
    });
  },
});

Deno.test({
  name: "etcd: --user with --password or IDALLOC_ETCD_PASSWORD; a wrong password fails cleanly",
  ignore,
  fn: async () => {
    await using etcd = await startEtcd();
    await enableAuth(etcd.endpoints, "s3cret");
    const base = ["--store", `etcd://${etcd.endpoints[0].replace("http://", "")}`];
    const ok = await cli([...base, "--user", "root", "--password", "s3cret", "allocate", "k;"]);
    assert.equal(ok.code, 0, ok.stderr);
    // In a child process: setting the variable here would leak into tests running in parallel.
    const fromEnv = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "src/cli/main.ts", ...base, "--user", "root", "get", "k;"],
      cwd: new URL("../../../", import.meta.url).pathname,
      env: { IDALLOC_ETCD_PASSWORD: "s3cret" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(fromEnv.code, 0, new TextDecoder().decode(fromEnv.stderr));
    const wrong = await cli([
      ...base,
      "--user",
      "root",
      "--password",
      "wrong",
      "--connect-timeout",
      "1s",
      "get",
      "k;",
    ]);
    // Wrong credentials are the user's to fix, like a bad option: exit code 1.
    assert.equal(wrong.code, 1, wrong.stderr);
    assert.ok(isOneLineError(wrong.stderr), wrong.stderr);
    assert.match(wrong.stderr, /authentication failed/);
    assert.match(wrong.stderr, /check --user and --password/, "says what to fix");
    assert.doesNotMatch(wrong.stderr, /\((connect|gc list|get)\)/, "names no internal step");
  },
});
