/**
 * TLS (server certificates from a private CA, and mutual TLS) and password authentication.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import { Range } from "etcd3";
import { EtcdBackend, StoreAccessDeniedError } from "../../../src/backends/etcd/mod.ts";
import { IdallocError } from "../../../src/errors.ts";
import { startEtcd } from "../../_support/etcd.ts";
import { rawClient } from "../../_support/etcd_fixture.ts";
import { etcdTest } from "./_helpers.ts";

/** The DNS name in the test server certificate (Deno's TLS refuses an IP address as SNI). */
const SERVER_NAME = "etcd.idalloc.test";

function hasOpenssl(): boolean {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    try {
      if (dir && Deno.statSync(`${dir}/openssl`).isFile) return true;
    } catch {
      // not here
    }
  }
  return false;
}

async function openssl(dir: string, ...args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", { args, cwd: dir, stdout: "null", stderr: "piped" })
    .output();
  if (!out.success) throw new Error(`openssl ${args[0]}: ${new TextDecoder().decode(out.stderr)}`);
}

/** P-256 keys: generated in milliseconds, unlike RSA. */
const EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

/** A private CA, a server certificate for 127.0.0.1 and a client certificate, as files. */
async function makeCerts(
  dir: string,
): Promise<Record<"ca" | "cert" | "key" | "clientCert" | "clientKey", string>> {
  await Deno.writeTextFile(
    `${dir}/server.ext`,
    "subjectAltName=IP:127.0.0.1,DNS:etcd.idalloc.test\nextendedKeyUsage=serverAuth\n",
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
    "/CN=idalloc test CA",
  );
  for (const [name, cn] of [["server", "127.0.0.1"], ["client", "idalloc"]]) {
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
      `/CN=${cn}`,
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
  return {
    ca: `${dir}/ca.crt`,
    cert: `${dir}/server.crt`,
    key: `${dir}/server.key`,
    clientCert: `${dir}/client.crt`,
    clientKey: `${dir}/client.key`,
  };
}

etcdTest(
  "TLS with a private CA, then mutual TLS: the backend connects and allocates",
  async (t) => {
    if (!hasOpenssl()) {
      console.error("!!! openssl not found: skipping the TLS test");
      return;
    }
    const dir = await Deno.makeTempDir({ prefix: "idalloc-tls-" });
    try {
      const files = await makeCerts(dir);
      const ca = await Deno.readTextFile(files.ca);
      await t.step("server TLS", async () => {
        await using etcd = await startEtcd({
          tls: { ca: files.ca, cert: files.cert, key: files.key },
        });
        assert.ok(etcd.endpoints[0].startsWith("https://"));
        await using backend = await EtcdBackend.connect({
          endpoints: [...etcd.endpoints],
          prefix: "tls",
          node: "a",
          tls: { ca, serverName: SERVER_NAME },
        });
        await using alloc = await Allocator.open(backend, { min: 1, max: 100, leaseTtlMs: 2_000 });
        assert.equal((await alloc.allocate("k;")).id > 0, true);
        // A CA that did not sign the server's certificate is refused.
        const otherDir = await Deno.makeTempDir({ prefix: "idalloc-tls-other-" });
        try {
          const other = await makeCerts(otherDir);
          await assert.rejects(
            EtcdBackend.connect({
              endpoints: [...etcd.endpoints],
              node: "b",
              tls: { ca: await Deno.readTextFile(other.ca), serverName: SERVER_NAME },
              dialTimeoutMs: 1_000,
            }),
            IdallocError,
          );
        } finally {
          await Deno.remove(otherDir, { recursive: true });
        }
      });
      await t.step("mutual TLS", async () => {
        await using etcd = await startEtcd({
          tls: {
            ca: files.ca,
            cert: files.cert,
            key: files.key,
            client: { cert: files.clientCert, key: files.clientKey },
          },
        });
        await using backend = await EtcdBackend.connect({
          endpoints: [...etcd.endpoints],
          prefix: "mtls",
          node: "a",
          tls: {
            ca,
            cert: await Deno.readTextFile(files.clientCert),
            key: await Deno.readTextFile(files.clientKey),
            serverName: SERVER_NAME,
          },
        });
        await using alloc = await Allocator.open(backend, { min: 1, max: 100, leaseTtlMs: 2_000 });
        assert.equal((await alloc.allocate("k;")).id > 0, true);
        // Without a client certificate the server refuses the connection.
        await assert.rejects(
          EtcdBackend.connect({
            endpoints: [...etcd.endpoints],
            node: "b",
            tls: { ca, serverName: SERVER_NAME },
            dialTimeoutMs: 1_000,
          }),
          IdallocError,
        );
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
);

etcdTest(
  "user/password authentication: right password allocates, wrong one and missing permissions " +
    "are StoreAccessDeniedError",
  async () => {
    await using etcd = await startEtcd();
    const raw = rawClient(etcd.endpoints);
    try {
      await raw.role("root").create();
      await raw.user("root").create("s3cret");
      await raw.user("root").addRole("root");
      // A user who may only read the "auth" prefix.
      await raw.role("reader").create();
      await raw.role("reader").grant({ permission: "Read", range: Range.prefix("auth/") });
      await raw.user("reader").create("r3ad");
      await raw.user("reader").addRole("reader");
      await raw.auth.authEnable();
    } finally {
      raw.close();
    }
    await using backend = await EtcdBackend.connect({
      endpoints: [...etcd.endpoints],
      prefix: "auth",
      node: "a",
      user: "root",
      password: "s3cret",
    });
    await using alloc = await Allocator.open(backend, { min: 1, max: 100, leaseTtlMs: 2_000 });
    const { id } = await alloc.allocate("k;");
    assert.ok(id > 0);

    const denied = (e: unknown) => {
      assert.ok(e instanceof StoreAccessDeniedError, String(e));
      assert.ok(e instanceof IdallocError);
      assert.equal(e.name, "StoreAccessDeniedError");
      assert.equal(e.retryable, false);
      return true;
    };
    // A wrong password is refused at once, not retried until the dial timeout as if etcd were down.
    await assert.rejects(
      EtcdBackend.connect({
        endpoints: [...etcd.endpoints],
        node: "b",
        user: "root",
        password: "wrong",
        dialTimeoutMs: 1_000,
      }),
      (e) => denied(e) && /authentication failed/i.test((e as Error).message),
    );
    await assert.rejects(
      EtcdBackend.connect({
        endpoints: [...etcd.endpoints],
        node: "b",
        user: "nobody",
        password: "x",
        dialTimeoutMs: 1_000,
      }),
      denied,
    );

    // The reader lists the prefix but may not write to it.
    await using reader = await EtcdBackend.connect({
      endpoints: [...etcd.endpoints],
      prefix: "auth",
      node: "r",
      user: "reader",
      password: "r3ad",
    });
    await using ro = await Allocator.open(reader, { min: 1, max: 100, readOnly: true });
    assert.equal(await ro.getById(id), "k;");
    const session = await reader.openSession({
      leaseTtlMs: 2_000,
      readOnly: false,
      onLeaseReplaced: () => {},
    });
    try {
      await assert.rejects(
        session.acquire({
          key: "other;",
          pickCandidate: (exclude) => exclude.has(50) ? undefined : 50,
          signal: AbortSignal.timeout(10_000),
        }),
        (e) => denied(e) && /permission denied/i.test((e as Error).message),
      );
    } finally {
      await session.close();
    }
    // Outside its prefix, not even reading is allowed.
    await using elsewhere = await EtcdBackend.connect({
      endpoints: [...etcd.endpoints],
      prefix: "other",
      node: "r",
      user: "reader",
      password: "r3ad",
    });
    const other = await elsewhere.openSession({
      leaseTtlMs: 2_000,
      readOnly: true,
      onLeaseReplaced: () => {},
    });
    try {
      await assert.rejects(other.getById(1, AbortSignal.timeout(10_000)), denied);
    } finally {
      await other.close();
    }
  },
);
