/**
 * The CLI's words for etcd connection and setup failures, against real servers on loopback: one
 * line naming the endpoint and what to do, `docs/cli.md`'s exit class, the error class's name in
 * `--json`, within seconds by default (a connect timeout of its own, not `--timeout`).
 */
import assert from "node:assert/strict";
import {
  etcdUnavailable,
  freePort,
  startEtcd,
} from "../../../src/backends/etcd/testing/cluster.ts";
import { http1Server, http2Server, silentServer } from "../../_support/fake_servers.ts";
import { hasOpenssl, withCerts } from "../../_support/tls.ts";
import { runCommand } from "../../_support/commands.ts";
import { cli, isOneLineError } from "../../cli/_run.ts";

const ignoreEtcd = etcdUnavailable() !== undefined;

/**
 * Runs the CLI with `--store etcd://<host> … list`, checks the shape (one line naming `names`, by
 * default the endpoint; the same message in `--json`), returns both.
 */
async function failing(
  host: string,
  code: number,
  extra: string[] = [],
  names = host,
): Promise<{ human: string; json: { code: number; name: string; message: string } }> {
  const args = ["--store", `etcd://${host}`, ...extra, "list"];
  const began = performance.now();
  const human = await cli(args);
  const ms = performance.now() - began;
  assert.equal(human.code, code, human.stderr);
  assert.ok(isOneLineError(human.stderr), human.stderr);
  assert.ok(human.stderr.includes(names), `names ${names}: ${human.stderr}`);
  // Ended by the connect timeout (5 s by default), not by --timeout (30 s): anything well below
  // 30 s says so, with room for a loaded machine (process start, type check, slow loopback).
  assert.ok(ms < 20_000, `took ${Math.round(ms)} ms`);
  const json = await cli([...args, "--json"]);
  assert.equal(json.code, code);
  const parsed = JSON.parse(json.stderr).error;
  assert.equal(parsed.code, code);
  assert.equal(parsed.message, human.stderr.trim().replace(/^idalloc: /, ""));
  return { human: human.stderr, json: parsed };
}

Deno.test("etcd: an unresolvable host and a closed port are 'store unavailable' (2)", async () => {
  const dns = await failing("nonexistent.invalid:2379", 2);
  assert.equal(dns.json.name, "StoreHostNotFoundError");
  assert.match(dns.human, /cannot resolve the host name nonexistent\.invalid/);
  const port = await freePort();
  const refused = await failing(`127.0.0.1:${port}`, 2);
  assert.equal(refused.json.name, "StoreConnectionRefusedError");
  assert.match(refused.human, /refused the connection.*check that etcd runs there/);
});

Deno.test("etcd: an HTTP/1 or HTTP/2 server on the port is a setup mistake (1)", async () => {
  {
    await using h1 = await http1Server();
    const got = await failing(`127.0.0.1:${h1.port}`, 1);
    assert.equal(got.json.name, "NotEtcdServerError");
    assert.match(got.human, /is not an etcd server.*check the host and port in --store/);
  }
  await using h2 = await http2Server();
  const got = await failing(`127.0.0.1:${h2.port}`, 1);
  assert.equal(got.json.name, "NotEtcdServerError");
  assert.doesNotMatch(got.human, /UNIMPLEMENTED/, "no raw gRPC text");
});

Deno.test({
  name: "etcd: --user on an etcd without auth (1); TLS setup mistakes (1)",
  ignore: ignoreEtcd,
  fn: async () => {
    await using etcd = await startEtcd();
    const host = etcd.endpoints[0].replace("http://", "");
    const auth = await failing(host, 1, ["--user", "root", "--password", "x"]);
    assert.equal(auth.json.name, "AuthNotEnabledError");
    assert.match(auth.human, /authentication turned off.*drop --user and --password/);
    assert.doesNotMatch(auth.human, /FAILED_PRECONDITION/, "no raw gRPC text");
    if (!hasOpenssl()) return;
    await withCerts("idalloc-cli-connect-", async (files) => {
      const ip = await failing(host, 1, ["--ca", files.ca]);
      assert.equal(ip.json.name, "StoreTlsError");
      assert.match(ip.human, /IP address 127\.0\.0\.1.*give --tls-server-name/);
      const notCert = await failing(host, 1, ["--ca", files.key], files.key);
      assert.equal(notCert.json.name, "StoreTlsError");
      assert.ok(notCert.human.includes(`--ca file ${files.key} is not a PEM certificate`));
    });
  },
});

Deno.test("etcd that never answers: fails after the 5s connect timeout, not --timeout", async () => {
  // The CLI runs as a process (grpc-js keeps its handshake timers for such a peer a while after
  // close()).
  await using silent = silentServer();
  const run = async (...extra: string[]) => {
    const began = performance.now();
    const out = await runCommand(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "src/cli/main.ts",
        "--store",
        `etcd://127.0.0.1:${silent.port}`,
        ...extra,
        "get",
        "k",
      ],
      cwd: new URL("../../../", import.meta.url).pathname,
    });
    return { ...out, ms: performance.now() - began };
  };
  const byDefault = await run();
  assert.equal(byDefault.code, 2, byDefault.stderr);
  assert.match(byDefault.stderr, /etcd at http:\/\/127\.0\.0\.1:\d+ did not answer within 5s/);
  // Well below --timeout's 30 s, with room for a loaded machine to start the process.
  assert.ok(byDefault.ms < 20_000, `${byDefault.ms} ms: not the 30 s --timeout`);
  // A --timeout shorter than the connect timeout bounds connecting; the message still names
  // the endpoint and what happened.
  const short = await run("--timeout", "1s");
  assert.equal(short.code, 2, short.stderr);
  assert.match(short.stderr, /etcd at http:\/\/127\.0\.0\.1:\d+ did not answer within 1s/);
  // In plain words, one line, what happened included.
  const connect = await run("--connect-timeout", "1s");
  assert.equal(connect.code, 2, connect.stderr);
  assert.match(
    connect.stderr,
    /^idalloc: store unavailable: etcd at http:\/\/127\.0\.0\.1:\d+ did not answer within 1s \(no answer\)\n$/,
  );
});
