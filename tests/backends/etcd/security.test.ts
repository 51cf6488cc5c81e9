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

/**
 * One request of etcd's JSON gateway as user root (`/v3/auth/authenticate` first). etcd3's client
 * leaks a gRPC channel per token it fetches; the gateway needs none.
 */
async function asRoot(
  endpoint: string,
  password: string,
  path: string,
  body: unknown,
): Promise<void> {
  const post = async (path: string, body: unknown, token?: string) => {
    const res = await fetch(`${endpoint}${path}`, {
      method: "POST",
      headers: token === undefined ? {} : { authorization: token },
      body: JSON.stringify(body),
    });
    const json = await res.json();
    assert.equal(res.status, 200, JSON.stringify(json));
    return json;
  };
  const { token } = await post("/v3/auth/authenticate", { name: "root", password });
  await post(path, body, token);
}

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
    // A writable session is refused when it opens (its first write claims the node's name), not
    // at its first allocation.
    await assert.rejects(
      reader.openSession({ leaseTtlMs: 2_000, readOnly: false, onLeaseReplaced: () => {} }),
      (e) => denied(e) && /permission denied/i.test((e as Error).message),
    );
    // Outside its prefix, not even reading is allowed: refused when connecting.
    await assert.rejects(
      connect(etcd, "r", { prefix: "other", user: "reader", password: "r3ad" }),
      (e) => denied(e) && /refused user reader access to prefix other\//.test((e as Error).message),
    );
  },
);

etcdTest(
  "auth on: no user, or one without permission on the prefix, fails at connect; access taken " +
    "away later fails each call at once, never at the caller's deadline",
  async () => {
    await using etcd = await startEtcd();
    await enableAuth(etcd.endpoints, "s3cret", async (raw) => {
      for (
        const [user, range, permission] of [
          ["worker", "app/", "Readwrite"],
          ["reader", "app/", "Read"],
          ["stranger", "elsewhere/", "Readwrite"],
        ] as const
      ) {
        await raw.role(user).create();
        await raw.role(user).grant({ permission, range: Range.prefix(range) });
        await raw.user(user).create("pw");
        await raw.user(user).addRole(user);
      }
    });
    const denied = (pattern: RegExp) => (e: unknown) => {
      assert.ok(e instanceof StoreAccessDeniedError, String(e));
      assert.equal(e.retryable, false);
      assert.match(e.message, pattern);
      return true;
    };
    // etcd answers its status to anyone: only a read under the prefix tells.
    await assert.rejects(
      connect(etcd, "a", { prefix: "app" }),
      denied(/refused access to prefix app\/: authentication is on and no user was given/),
    );
    await assert.rejects(
      connect(etcd, "a", { prefix: "app", user: "stranger", password: "pw" }),
      denied(/refused user stranger access to prefix app\/ \(permission denied\)/),
    );
    // A reader connects, and reads, but Allocator.open for writing is refused at once.
    {
      await using reader = await connect(etcd, "r", {
        prefix: "app",
        user: "reader",
        password: "pw",
      });
      await assert.rejects(
        Allocator.open(reader, { max: 100 }, { signal: AbortSignal.timeout(60_000) }),
        denied(/permission denied/),
      );
    }

    // Access taken away from a running node: every call that etcd denies fails at once.
    await using backend = await connect(etcd, "w", {
      prefix: "app",
      user: "worker",
      password: "pw",
    });
    await using alloc = await Allocator.open(backend, { max: 100, leaseTtlMs: 2_000 });
    assert.ok((await alloc.allocate("before;")).id > 0);
    await asRoot(etcd.endpoints[0], "s3cret", "/v3/auth/user/revoke", {
      name: "worker",
      role: "worker",
    });
    // A long deadline: a hang would end in a TimeoutError, not in the access error.
    const signal = AbortSignal.timeout(60_000);
    await assert.rejects(alloc.allocate("after;", { signal }), denied(/permission denied/));
    // A new allocator on the connected backend waits for its initial list, which etcd refuses.
    await using late = await Allocator.open(backend, { max: 100, readOnly: true }, { signal });
    await assert.rejects(late.waitForInitialSync({ signal }), denied(/permission denied/));
    await assert.rejects(late.getNoCache("before;", { signal }), denied(/permission denied/));
  },
);
