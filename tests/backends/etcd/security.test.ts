/**
 * TLS (server certificates from a private CA, and mutual TLS) and password authentication.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import { Range } from "etcd3";
import {
  EtcdBackend,
  type EtcdBackendOptions,
  StoreAccessDeniedError,
} from "../../../src/backends/etcd/mod.ts";
import { IdallocError } from "../../../src/errors.ts";
import { type EtcdCluster, startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { enableAuth } from "../../_support/etcd_auth.ts";
import { etcdTls, hasOpenssl, SERVER_NAME, withCerts } from "../../_support/tls.ts";
import { etcdTest } from "./_helpers.ts";

/** A backend for `node` on `etcd`. */
function connect(
  etcd: EtcdCluster,
  node: string,
  options: Partial<EtcdBackendOptions>,
): Promise<EtcdBackend> {
  return EtcdBackend.connect({ endpoints: [...etcd.endpoints], node, ...options });
}

/** Node "b" connecting with `options`; gives up after 1 s (for connections that must fail). */
function connectOther(
  etcd: EtcdCluster,
  options: Partial<EtcdBackendOptions>,
): Promise<EtcdBackend> {
  return connect(etcd, "b", { dialTimeoutMs: 1_000, ...options });
}

etcdTest(
  "TLS with a private CA, then mutual TLS: the backend connects and allocates",
  async (t) => {
    if (!hasOpenssl()) {
      console.error("!!! openssl not found: skipping the TLS test");
      return;
    }
    await withCerts("idalloc-tls-", async (files) => {
      const ca = await Deno.readTextFile(files.ca);
      await t.step("server TLS", async () => {
        await using etcd = await startEtcd({ tls: etcdTls(files) });
        assert.ok(etcd.endpoints[0].startsWith("https://"));
        await using backend = await connect(etcd, "a", {
          prefix: "tls",
          tls: { ca, serverName: SERVER_NAME },
        });
        await using alloc = await Allocator.open(backend, { min: 1, max: 100, leaseTtlMs: 2_000 });
        assert.equal((await alloc.allocate("k;")).id > 0, true);
        // A CA that did not sign the server's certificate is refused.
        await withCerts("idalloc-tls-other-", async (other) => {
          await assert.rejects(
            connectOther(etcd, {
              tls: { ca: await Deno.readTextFile(other.ca), serverName: SERVER_NAME },
            }),
            IdallocError,
          );
        });
      });
      await t.step("mutual TLS", async () => {
        await using etcd = await startEtcd({ tls: etcdTls(files, { mutual: true }) });
        await using backend = await connect(etcd, "a", {
          prefix: "mtls",
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
          connectOther(etcd, { tls: { ca, serverName: SERVER_NAME } }),
          IdallocError,
        );
      });
    });
  },
);

etcdTest(
  "user/password authentication: right password allocates, wrong one and missing permissions " +
    "are StoreAccessDeniedError",
  async () => {
    await using etcd = await startEtcd();
    await enableAuth(etcd.endpoints, "s3cret", async (raw) => {
      // A user who may only read the "auth" prefix.
      await raw.role("reader").create();
      await raw.role("reader").grant({ permission: "Read", range: Range.prefix("auth/") });
      await raw.user("reader").create("r3ad");
      await raw.user("reader").addRole("reader");
    });
    await using backend = await connect(etcd, "a", {
      prefix: "auth",
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
      connectOther(etcd, { user: "root", password: "wrong" }),
      (e) => denied(e) && /authentication failed/i.test((e as Error).message),
    );
    await assert.rejects(connectOther(etcd, { user: "nobody", password: "x" }), denied);

    // The reader lists the prefix but may not write to it.
    await using reader = await connect(etcd, "r", {
      prefix: "auth",
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
    await using elsewhere = await connect(etcd, "r", {
      prefix: "other",
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
