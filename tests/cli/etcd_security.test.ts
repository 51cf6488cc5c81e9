/**
 * The CLI's etcd security flags end to end: `--ca/--cert/--key/--tls-server-name` against a
 * private etcd demanding client certificates, and `--user/--password` (also from the environment).
 */
import assert from "node:assert/strict";
import { etcdUnavailable, startEtcd } from "../_support/etcd.ts";
import { rawClient } from "../_support/etcd_fixture.ts";
import { cli, isOneLineError } from "./_run.ts";

const ignore = etcdUnavailable() !== undefined;
/** A DNS name of the server certificate: Deno's TLS refuses an IP address as SNI. */
const SERVER_NAME = "etcd.idalloc.test";
const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

function hasOpenssl(): boolean {
  return (Deno.env.get("PATH") ?? "").split(":").some((dir) => {
    try {
      return dir !== "" && Deno.statSync(`${dir}/openssl`).isFile;
    } catch {
      return false;
    }
  });
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", { args, cwd: dir, stdout: "null", stderr: "piped" })
    .output();
  if (!out.success) throw new Error(`openssl ${args[0]}: ${new TextDecoder().decode(out.stderr)}`);
}

/** A private CA with a server certificate (127.0.0.1, SERVER_NAME) and a client certificate. */
async function makeCerts(dir: string): Promise<void> {
  await Deno.writeTextFile(
    `${dir}/server.ext`,
    `subjectAltName=IP:127.0.0.1,DNS:${SERVER_NAME}\nextendedKeyUsage=serverAuth\n`,
  );
  await Deno.writeTextFile(`${dir}/client.ext`, "extendedKeyUsage=clientAuth\n");
  await openssl(
    dir,
    "req",
    "-x509",
    ...EC_KEY,
    "-nodes",
    "-keyout",
    "ca.key",
    "-out",
    "ca.crt",
    "-days",
    "1",
    "-subj",
    "/CN=idalloc CLI test CA",
  );
  for (const name of ["server", "client"]) {
    await openssl(
      dir,
      "req",
      ...EC_KEY,
      "-nodes",
      "-keyout",
      `${name}.key`,
      "-out",
      `${name}.csr`,
      "-subj",
      `/CN=${name}`,
    );
    await openssl(
      dir,
      "x509",
      "-req",
      "-in",
      `${name}.csr`,
      "-CA",
      "ca.crt",
      "-CAkey",
      "ca.key",
      "-CAcreateserial",
      "-out",
      `${name}.crt`,
      "-days",
      "1",
      "-extfile",
      `${name}.ext`,
    );
  }
}

Deno.test({
  name: "etcd: mutual TLS through --ca/--cert/--key/--tls-server-name",
  ignore: ignore || !hasOpenssl(),
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "idalloc-cli-tls-" });
    try {
      await makeCerts(dir);
      await using etcd = await startEtcd({
        tls: {
          ca: `${dir}/ca.crt`,
          cert: `${dir}/server.crt`,
          key: `${dir}/server.key`,
          client: { cert: `${dir}/client.crt`, key: `${dir}/client.key` },
        },
      });
      const host = etcd.endpoints[0].replace("https://", "");
      const base = ["--store", `etcd://${host}`, "--prefix", "cli-tls", "--ca", `${dir}/ca.crt`];
      const tls = [
        ...base,
        "--cert",
        `${dir}/client.crt`,
        "--key",
        `${dir}/client.key`,
        "--tls-server-name",
        SERVER_NAME,
      ];
      const allocated = await cli([...tls, "allocate", "app=web;", "--json"]);
      assert.equal(allocated.code, 0, allocated.stderr);
      const { id } = JSON.parse(allocated.stdout);
      assert.equal((await cli([...tls, "get-id", String(id)])).stdout, "app=web;\n");
      // Without the client certificate the server refuses: the store is unavailable to us.
      const refused = await cli([
        ...base,
        "--tls-server-name",
        SERVER_NAME,
        "--connect-timeout",
        "1s",
        "list",
      ]);
      assert.equal(refused.code, 2);
      assert.ok(isOneLineError(refused.stderr), refused.stderr);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test({
  name: "etcd: --user with --password or IDALLOC_ETCD_PASSWORD; a wrong password fails cleanly",
  ignore,
  fn: async () => {
    await using etcd = await startEtcd();
    const raw = rawClient(etcd.endpoints);
    try {
      await raw.role("root").create();
      await raw.user("root").create("s3cret");
      await raw.user("root").addRole("root");
      await raw.auth.authEnable();
    } finally {
      raw.close();
    }
    const base = ["--store", `etcd://${etcd.endpoints[0].replace("http://", "")}`];
    const ok = await cli([...base, "--user", "root", "--password", "s3cret", "allocate", "k;"]);
    assert.equal(ok.code, 0, ok.stderr);
    // In a child process: setting the variable here would leak into tests running in parallel.
    const fromEnv = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "src/cli/main.ts", ...base, "--user", "root", "get", "k;"],
      cwd: new URL("../../", import.meta.url).pathname,
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
  },
});
