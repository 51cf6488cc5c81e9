/**
 * Connection and setup failures of `EtcdBackend.connect`, each against a real server on loopback:
 * its own error class (stable `name`, the client's error as `cause`), a message that names the
 * endpoint, and fast — well inside a dial timeout much longer than the grace `connect` gives.
 */
import assert from "node:assert/strict";
import {
  AuthNotEnabledError,
  EtcdBackend,
  type EtcdBackendOptions,
  NotEtcdServerError,
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  StoreUnavailableError,
  type TlsProblem,
} from "../../../src/backends/etcd/mod.ts";
import {
  type EtcdCluster,
  freePort,
  startEtcd,
} from "../../../src/backends/etcd/testing/cluster.ts";
import { enableAuth } from "../../_support/etcd_auth.ts";
import { http1Server, http2Server } from "../../_support/fake_servers.ts";
import { etcdTls, hasOpenssl, SERVER_NAME, withCerts } from "../../_support/tls.ts";
import { etcdTest } from "./_helpers.ts";

/** Far longer than any of these failures may take: waiting it out would fail the time check. */
const DIAL_MS = 20_000;
/** The most a definite failure may take (about a second of grace, plus a loaded machine: 1–3.5 s seen at load 11 on 2 cores). */
const FAST_MS = 8_000;

/** Connects with `options`, expects a rejection, and returns it with the time it took. */
async function failure(
  options: Partial<EtcdBackendOptions> & Pick<EtcdBackendOptions, "endpoints">,
): Promise<{ err: Error; ms: number }> {
  const began = performance.now();
  try {
    const backend = await EtcdBackend.connect({ node: "n", dialTimeoutMs: DIAL_MS, ...options });
    await backend.close();
  } catch (err) {
    assert.ok(err instanceof Error, String(err));
    return { err, ms: performance.now() - began };
  }
  throw new Error(`connecting to ${options.endpoints.join(",")} succeeded`);
}

/** The common checks: the class, its stable name, the endpoint named, a cause, fast. */
function check(
  got: { err: Error; ms: number },
  type: abstract new (...args: never[]) => Error,
  name: string,
  endpoint: string,
): void {
  const { err, ms } = got;
  assert.ok(err instanceof type, `${name} expected, got ${err.name}: ${err.message}`);
  assert.equal(err.name, name);
  assert.ok(err.message.includes(endpoint), `names ${endpoint}: ${err.message}`);
  assert.ok(err.cause !== undefined, "keeps the client's error as cause");
  assert.ok(ms < FAST_MS, `${name} after ${Math.round(ms)} ms (dial timeout ${DIAL_MS} ms)`);
}

Deno.test("connect: a host name that does not resolve → StoreHostNotFoundError, fast", async () => {
  const endpoint = "http://nonexistent.invalid:2379";
  const got = await failure({ endpoints: [endpoint] });
  check(got, StoreHostNotFoundError, "StoreHostNotFoundError", endpoint);
  assert.ok(got.err instanceof StoreUnavailableError && got.err.retryable);
  assert.equal((got.err as StoreHostNotFoundError).host, "nonexistent.invalid");
  assert.match(got.err.message, /cannot resolve the host name nonexistent\.invalid/);
});

Deno.test("connect: a closed port → StoreConnectionRefusedError, fast", async () => {
  const endpoint = `http://127.0.0.1:${await freePort()}`;
  const got = await failure({ endpoints: [endpoint] });
  check(got, StoreConnectionRefusedError, "StoreConnectionRefusedError", endpoint);
  assert.ok(got.err instanceof StoreUnavailableError && got.err.retryable);
  assert.match(got.err.message, /refused the connection/);
});

Deno.test("connect: an HTTP/1 server on the port → NotEtcdServerError, fast", async () => {
  await using server = await http1Server();
  const got = await failure({ endpoints: [server.url] });
  check(got, NotEtcdServerError, "NotEtcdServerError", server.url);
  assert.equal((got.err as NotEtcdServerError).retryable, false);
  assert.match(got.err.message, /is not an etcd server/);
});

Deno.test("connect: an HTTP/2 server that is not etcd → NotEtcdServerError", async () => {
  {
    await using server = await http2Server();
    const got = await failure({ endpoints: [server.url] });
    check(got, NotEtcdServerError, "NotEtcdServerError", server.url);
    assert.match(got.err.message, /HTTP status 404/);
  }
  // With an error page, grpc-js reads the page's first bytes as a gRPC message length.
  await using server = await http2Server("<html>not found</html>\n");
  const got = await failure({ endpoints: [server.url] });
  check(got, NotEtcdServerError, "NotEtcdServerError", server.url);
  assert.match(got.err.message, /not a gRPC message/);
});

etcdTest("connect: credentials for an etcd without auth, then wrong credentials", async () => {
  await using etcd = await startEtcd();
  const endpoint = etcd.endpoints[0];
  const notEnabled = await failure({ endpoints: [endpoint], user: "root", password: "x" });
  check(notEnabled, AuthNotEnabledError, "AuthNotEnabledError", endpoint);
  assert.ok(notEnabled.err instanceof StoreAccessDeniedError, "a kind of access problem");
  assert.match(notEnabled.err.message, /authentication turned off/);

  await enableAuth(etcd.endpoints, "s3cret");
  const denied = await failure({ endpoints: [endpoint], user: "root", password: "wrong" });
  check(denied, StoreAccessDeniedError, "StoreAccessDeniedError", endpoint);
  assert.match(denied.err.message, /authentication failed/);
});

etcdTest("connect: TLS mistakes, each a StoreTlsError with its problem, fast", async (t) => {
  if (!hasOpenssl()) {
    console.error("!!! openssl not found: skipping the TLS test");
    return;
  }
  await withCerts("idalloc-tls-errors-", async (files) => {
    const ca = await Deno.readTextFile(files.ca);
    const tlsError = async (
      endpoint: string,
      tls: EtcdBackendOptions["tls"],
      problem: TlsProblem,
      words: RegExp,
    ) => {
      const got = await failure({ endpoints: [endpoint], tls });
      check(got, StoreTlsError, "StoreTlsError", endpoint);
      assert.equal((got.err as StoreTlsError).problem, problem, got.err.message);
      assert.equal((got.err as StoreTlsError).retryable, false);
      assert.match(got.err.message, words);
    };
    await using tlsEtcd: EtcdCluster = await startEtcd({ tls: etcdTls(files) });
    const https = tlsEtcd.endpoints[0];
    await t.step("a CA file that is not a certificate: refused before dialling", async () => {
      const got = await failure({ endpoints: [https], tls: { ca: "not a certificate\n" } });
      assert.ok(got.err instanceof StoreTlsError && got.err.problem === "not-a-certificate");
      assert.match(got.err.message, /is not a PEM certificate/);
      assert.ok(got.ms < 1_000, `${got.ms} ms`);
    });
    await t.step("an IP address endpoint without a server name", async () => {
      await tlsError(https, { ca }, "ip-server-name", /IP address 127\.0\.0\.1/);
    });
    await t.step("a server name the certificate does not hold", async () => {
      await tlsError(
        https,
        { ca, serverName: "wrong.example" },
        "name-mismatch",
        /not valid for the name wrong\.example \(it names .*etcd\.idalloc\.test/,
      );
    });
    await t.step("a CA that did not sign the server certificate", async () => {
      await withCerts("idalloc-tls-other-", async (other) => {
        await tlsError(
          https,
          { ca: await Deno.readTextFile(other.ca), serverName: SERVER_NAME },
          "untrusted",
          /not signed by the CA given/,
        );
      });
    });
    await t.step("no TLS to a TLS-only etcd", async () => {
      await tlsError(https.replace("https:", "http:"), undefined, "tls-required", /speaks TLS/);
    });
    await using plain = await startEtcd();
    await t.step("TLS to a plain-text etcd", async () => {
      await tlsError(
        plain.endpoints[0].replace("http:", "https:"),
        { ca, serverName: SERVER_NAME },
        "not-tls",
        /does not speak TLS/,
      );
    });
    await using mutual = await startEtcd({ tls: etcdTls(files, { mutual: true }) });
    await t.step("no client certificate for an etcd that demands one", async () => {
      await tlsError(
        mutual.endpoints[0],
        { ca, serverName: SERVER_NAME },
        "client-certificate",
        /client certificate/,
      );
    });
  });
});
