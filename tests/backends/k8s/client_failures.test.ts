/**
 * Failures at the Kubernetes API boundary, each as its typed error with a message an operator acts
 * on, and fast: nothing listening, an HTTP/1 server, an etcd port, TLS problems, a refused token,
 * a user without RBAC rights (the rule to add), a CRD that is not installed, a server that never
 * answers; and `probe()`, which finds them up front.
 */
import assert from "node:assert/strict";
import { createServer as createHttpServer } from "node:http";
import { createServer as createTcpServer, type Server, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { readFile } from "node:fs/promises";
import { createKubeClient, type KubeClient } from "../../../src/backends/k8s/client.ts";
import {
  NotKubernetesApiError,
  ResourceNotInstalledError,
} from "../../../src/backends/k8s/errors.ts";
import { transportFailure } from "../../../src/backends/k8s/failure.ts";
import type { KubeConnection } from "../../../src/backends/k8s/kubeconfig.ts";
import { freePort } from "../../../src/backends/etcd/testing/cluster.ts";
import { endpointCrd } from "../../../src/backends/k8s/testing/crds.ts";
import {
  identityResource,
  sharedKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import {
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  StoreUnavailableError,
} from "../../../src/errors.ts";
import { eventually } from "../../_support/eventually.ts";
import { test } from "../../_support/test.ts";
import { apiServerTests } from "./_client_support.ts";

const k8sTest = apiServerTests("failures");

const CILIUM = identityResource();

function connection(server: string, extra: Partial<KubeConnection> = {}): KubeConnection {
  return { server, namespace: "default", source: "test settings", token: "t", ...extra };
}

/** Runs `call` on a client of `conn` and returns what it threw. */
async function failure(
  conn: KubeConnection,
  call: (client: KubeClient) => Promise<unknown> = (c) => c.list(CILIUM, { limit: 1 }),
): Promise<Error> {
  await using client = await createKubeClient(conn, { requestTimeoutMs: 5000 });
  const err = await call(client).then(() => undefined, (e) => e);
  assert.ok(err instanceof Error, "the call failed");
  return err;
}

/** A loopback HTTP/1 server answering every request with `status`, `type` and `body`. */
async function httpServer(
  status: number,
  type: string,
  body: string,
): Promise<{ url: string; close(): Promise<void> }> {
  const server = createHttpServer((_req, res) => {
    res.writeHead(status, { "content-type": type, connection: "close" });
    res.end(body);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/**
 * A certificate to name as the CA where no handshake gets far enough to verify anything (the
 * client only checks that it parses): the servers below close or answer before.
 */
const UNUSED_CA = [
  "-----BEGIN CERTIFICATE-----",
  "MIIBuTCCAV+gAwIBAgIUOEMz0fqTQqJlAqKKHuf5vl7pib4wCgYIKoZIzj0EAwIw",
  "MTEvMC0GA1UEAwwmaWRhbGxvYyB0ZXN0IENBIChuZXZlciB1c2VkIHRvIHZlcmlm",
  "eSkwIBcNMjYxMTI5MDE0ODE1WhgPMjEyNjExMDUwMTQ4MTVaMDExLzAtBgNVBAMM",
  "JmlkYWxsb2MgdGVzdCBDQSAobmV2ZXIgdXNlZCB0byB2ZXJpZnkpMFkwEwYHKoZI",
  "zj0CAQYIKoZIzj0DAQcDQgAEPXhEkPyQjFKIpUxZ8UvGwjszl55tLJT3tSR8FNgi",
  "aaH60avcWTAHrUTW1HLBDy54uNVioNlQ4l06IquU7all3qNTMFEwHQYDVR0OBBYE",
  "FDrp+8SteMC8WYQ0LSb+T16Mhp0QMB8GA1UdIwQYMBaAFDrp+8SteMC8WYQ0LSb+",
  "T16Mhp0QMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSAAwRQIgHHyEsD81",
  "EOAdTIDYbHwd3tTGEBpN/fenvfg/ZrOvxPACIQDrLT809gyFyrzIOojdkVCqFQMp",
  "uvGk8A10/OekfSUSVQ==",
  "-----END CERTIFICATE-----",
].join("\n");

/**
 * A loopback TCP port, named as an `https://` server, whose connections `serve` handles; `close()`
 * ends every open one.
 */
async function tcpServer(
  serve: (socket: Socket) => void,
): Promise<{ url: string; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  const server: Server = createTcpServer((socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => socket.destroy());
    serve(socket);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    close: () =>
      new Promise((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** A loopback port that accepts connections and never answers. */
const silentServer = () => tcpServer(() => {});

/** A loopback port that accepts connections and closes each at once, before any TLS byte. */
const closingServer = () => tcpServer((socket) => socket.destroy());

/**
 * A loopback port that answers whatever arrives first with a plain-text `HTTP/1.1 400` and closes:
 * a plain HTTP server where TLS is expected (the TLS ClientHello is a bad request to it).
 */
const plainTextServer = () =>
  tcpServer((socket) =>
    socket.once("data", () => {
      socket.end(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\ncontent-length: 11\r\n" +
          "connection: close\r\n\r\nbad request",
      );
    })
  );

const PYTHON_404 = `<!DOCTYPE HTML>\n<html lang="en"><head><title>Error response</title></head>` +
  "<body><h1>Error response</h1><p>Error code: 404</p></body></html>\n";

test("k8s failures: nothing listens on the port → StoreConnectionRefusedError", async () => {
  const port = await freePort();
  const err = await failure(connection(`https://127.0.0.1:${port}`));
  assert.ok(err instanceof StoreConnectionRefusedError, String(err));
  assert.match(err.message, /refused the connection: nothing listens on that port/);
  assert.match(err.message, new RegExp(`127\\.0\\.0\\.1:${port} \\(test settings\\)`));
});

test("k8s failures: an HTTP/1 server (http:// and https://) → NotKubernetesApiError", async () => {
  const server = await httpServer(404, "text/html;charset=utf-8", PYTHON_404);
  try {
    const plain = await failure(connection(server.url));
    assert.ok(plain instanceof NotKubernetesApiError, String(plain));
    assert.match(
      plain.message,
      /is not a Kubernetes API server: it answered HTTP 404 \(text\/html, "Error response"\)/,
    );
    const tls = await failure(connection(server.url.replace("http:", "https:")));
    assert.ok(tls instanceof NotKubernetesApiError, String(tls));
    assert.match(tls.message, /it does not speak TLS, and over plain HTTP it answered HTTP 404/);
    const version = await failure(connection(server.url), (c) => c.version());
    assert.ok(version instanceof NotKubernetesApiError, String(version));
  } finally {
    await server.close();
  }
});

test("k8s failures: a port closing connections before TLS (an API server still starting) → StoreUnavailableError, retryable", async () => {
  // A kube-apiserver that has bound its port but is not serving yet accepts and closes at once
  // (the nemesis met it after every restart): a restart in progress, not a setup mistake.
  const server = await closingServer();
  try {
    // Both stacks: node:https (a CA given) and, on Deno, fetch with the system's roots (none).
    for (const extra of [{ ca: UNUSED_CA }, {}]) {
      for (const call of [(c: KubeClient) => c.list(CILIUM), (c: KubeClient) => c.version()]) {
        const err = await failure(connection(server.url, extra), call);
        assert.ok(err instanceof StoreUnavailableError, String(err));
        assert.equal((err as StoreUnavailableError).retryable, true);
        assert.match(err.message, /closed the connection without an answer/);
      }
    }
  } finally {
    await server.close();
  }
});

test("k8s failures: a peer answering plain text where TLS is expected → not retryable", async () => {
  const server = await plainTextServer();
  try {
    for (const extra of [{ ca: UNUSED_CA }, {}]) {
      const err = await failure(connection(server.url, extra));
      // Over plain HTTP the same port answers 400: no Kubernetes API server (those speak TLS).
      assert.ok(err instanceof NotKubernetesApiError, String(err));
      assert.equal(err.retryable, false);
      assert.match(err.message, /it does not speak TLS, and over plain HTTP it answered HTTP 400/);
    }
  } finally {
    await server.close();
  }
});

test("k8s failures: 502, 503, 504 with a body that is no Status (a proxy, a timeout) → StoreUnavailableError, retryable", async () => {
  const answers = [
    [504, "text/plain; charset=utf-8", "upstream request timeout"],
    [503, "text/plain", "no healthy upstream"],
    [502, "text/html", "<html><head><title>502 Bad Gateway</title></head><body></body></html>"],
  ] as const;
  for (const [status, type, body] of answers) {
    const server = await httpServer(status, type, body);
    try {
      const calls = [
        (c: KubeClient) => c.list(CILIUM),
        (c: KubeClient) => c.get(CILIUM, "1"),
        (c: KubeClient) => c.version(),
        async (c: KubeClient) => {
          for await (const _ of c.watch(CILIUM, { resourceVersion: "0" })) break;
        },
      ];
      for (const call of calls) {
        const err = await failure(connection(server.url), call);
        assert.ok(err instanceof StoreUnavailableError, `${status}: ${err}`);
        assert.equal((err as StoreUnavailableError).retryable, true);
        assert.match(
          err.message,
          new RegExp(`answered HTTP ${status} \\(text/(plain|html), "[^"]+"\\): the API server`),
        );
      }
    } finally {
      await server.close();
    }
  }
});

test("k8s failures: a server answering 200 with something else → NotKubernetesApiError", async () => {
  const server = await httpServer(200, "text/plain", "hello\n");
  try {
    for (const call of [(c: KubeClient) => c.get(CILIUM, "1"), (c: KubeClient) => c.version()]) {
      const err = await failure(connection(server.url), call);
      assert.ok(err instanceof NotKubernetesApiError, String(err));
    }
  } finally {
    await server.close();
  }
});

k8sTest("an etcd client port → NotKubernetesApiError naming etcd", async () => {
  const cluster = await sharedKubeApiServer();
  const etcd = cluster.etcd.endpoints[0];
  const plain = await failure(connection(etcd), (c) => c.version());
  assert.ok(plain instanceof NotKubernetesApiError, String(plain));
  assert.match(plain.message, /an etcd server's client port answers there/);
  const list = await failure(connection(etcd));
  assert.ok(list instanceof NotKubernetesApiError, String(list));
  const tls = await failure(connection(etcd.replace("http:", "https:")), (c) => c.version());
  assert.ok(tls instanceof NotKubernetesApiError, String(tls));
  assert.match(tls.message, /does not speak TLS.*etcd/);
});

k8sTest("TLS: wrong CA, no CA, a CA file that is no certificate, http:// to TLS", async () => {
  const cluster = await sharedKubeApiServer();
  const token = cluster.token("admin");
  const otherCa = await readFile(`${cluster.dir}/client-ca.crt`, "utf8");
  const wrong = await failure(connection(cluster.server, { token, ca: otherCa }));
  assert.ok(wrong instanceof StoreTlsError, String(wrong));
  assert.equal(wrong.problem, "untrusted");
  assert.match(wrong.message, /not signed by the CA given/);

  const none = await failure(connection(cluster.server, { token }));
  assert.ok(none instanceof StoreTlsError, String(none));
  assert.equal(none.problem, "untrusted");
  assert.match(none.message, /no certificate-authority is given/);

  // Refused when the client is made, in words (Deno's TLS stack would say "BadEncoding").
  const garbage = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n";
  const bad = await createKubeClient(connection(cluster.server, { token, ca: garbage }))
    .then((c) => c.list(CILIUM).finally(() => c.close()))
    .then(() => undefined, (e) => e);
  assert.ok(bad instanceof StoreTlsError, String(bad));
  assert.equal(bad.problem, "not-a-certificate");

  const plain = await failure(connection(cluster.server.replace("https:", "http:"), { token }));
  assert.ok(plain instanceof StoreTlsError, String(plain));
  assert.equal(plain.problem, "tls-required");
  assert.match(plain.message, /speaks TLS: use https:\/\//);
});

k8sTest("a token the server does not know → StoreAccessDeniedError (401)", async () => {
  const cluster = await sharedKubeApiServer();
  const ca = await readFile(cluster.caFile, "utf8");
  for (const call of [(c: KubeClient) => c.list(CILIUM), (c: KubeClient) => c.version()]) {
    const err = await failure(connection(cluster.server, { ca, token: "wrong" }), call);
    assert.ok(err instanceof StoreAccessDeniedError, String(err));
    assert.match(err.message, /refused the credentials of test settings \(401 Unauthorized\)/);
  }
});

k8sTest("a user without rights → StoreAccessDeniedError naming verb, resource, rule", async () => {
  const cluster = await sharedKubeApiServer();
  await using nobody = await cluster.client("nobody");
  const list = await nobody.list(CILIUM).catch((e) => e);
  assert.ok(list instanceof StoreAccessDeniedError, String(list));
  assert.match(
    list.message,
    /^user "nobody" may not list ciliumidentities\.cilium\.io cluster-wide on https:\/\/127\.0\.0\.1:\d+ \(403 Forbidden\): add the rule \{apiGroups: \["cilium\.io"\], resources: \["ciliumidentities"\], verbs: \["list"\]\} to a ClusterRole bound to nobody$/,
  );
  const lease = { group: "coordination.k8s.io", version: "v1", plural: "leases", namespaced: true };
  const create = await nobody.create(lease, { metadata: { name: "x" } }, { namespace: "ns1" })
    .catch((e) => e);
  assert.ok(create instanceof StoreAccessDeniedError, String(create));
  assert.match(
    create.message,
    /may not create leases\.coordination\.k8s\.io in namespace ns1 .*\{apiGroups: \["coordination\.k8s\.io"\], resources: \["leases"\], verbs: \["create"\]\} to a Role in namespace ns1 \(or a ClusterRole\)/,
  );

  await using reader = await cluster.client("reader");
  await reader.list(CILIUM, { limit: 1 });
  const write = await reader.create(CILIUM, { metadata: { name: "9" }, "security-labels": {} })
    .catch((e) => e);
  assert.ok(write instanceof StoreAccessDeniedError, String(write));
  assert.match(write.message, /user "reader" may not create ciliumidentities\.cilium\.io/);
  const watch = await (async () => {
    for await (const _ of nobody.watch(CILIUM, { resourceVersion: "0" })) break;
  })().catch((e) => e);
  assert.ok(watch instanceof StoreAccessDeniedError, String(watch));
  assert.match(watch.message, /may not watch ciliumidentities/);
});

k8sTest("the CRD is not installed → ResourceNotInstalledError naming it", async () => {
  const cluster = await sharedKubeApiServer();
  await using client = await cluster.client();
  const missing = identityResource(`missing${crypto.randomUUID().slice(0, 8)}.idalloc.test`);
  const calls: ((c: KubeClient) => Promise<unknown>)[] = [
    (c) => c.list(missing),
    (c) => c.get(missing, "1"),
    (c) => c.create(missing, { metadata: { name: "1" }, "security-labels": {} }),
    (c) => c.delete(missing, "1"),
    (c) => c.patch(missing, "1", {}, { type: "merge" }),
    async (c) => {
      for await (const _ of c.watch(missing, { resourceVersion: "0" })) break;
    },
  ];
  for (const call of calls) {
    const err = await call(client).catch((e) => e);
    assert.ok(err instanceof ResourceNotInstalledError, String(err));
    assert.equal(err.resource, `ciliumidentities.${missing.group}`);
    assert.match(
      err.message,
      /does not serve ciliumidentities\.missing.*\/v2: install its CustomResourceDefinition/,
    );
  }
  // A fresh client (no answer seen yet) tells "not installed" from "not Kubernetes" too.
  await using fresh = await cluster.client();
  const err = await fresh.get(missing, "1").catch((e) => e);
  assert.ok(err instanceof ResourceNotInstalledError, String(err));
  const cilium = await fresh.list({ ...CILIUM, version: "v9" }).catch((e) => e);
  assert.ok(cilium instanceof ResourceNotInstalledError, String(cilium));
  // Cilium's own group at a version it does not serve: the message names the one it does.
  assert.match(cilium.message, /Cilium serves ciliumidentities\.cilium\.io as v2, not v9/);
});

k8sTest("a resource it served before and then not → StoreUnavailableError, retryable", async () => {
  // A restarting API server answers a CRD's paths with the mux's plain 404 until it has installed
  // their handlers again (a nemesis run's allocations failed as "not installed" right after an
  // API-server restart); removing the CRD gives the same answer, and is the case a test can hold.
  const cluster = await sharedKubeApiServer();
  const res = await cluster.installIdentityCrd();
  await using client = await cluster.client();
  await client.list(res);
  const crds = {
    group: "apiextensions.k8s.io",
    version: "v1",
    plural: "customresourcedefinitions",
    namespaced: false,
  };
  assert.ok(await client.delete(crds, `ciliumidentities.${res.group}`));
  let err: unknown;
  await eventually(async () => {
    err = await client.list(res).catch((e) => e);
    return !(err !== null && typeof err === "object" && "items" in err);
  }, "the removed CRD's path stops answering");
  assert.ok(err instanceof StoreUnavailableError, String(err));
  assert.equal(err.retryable, true);
  assert.match(err.message, /does not serve ciliumidentities\.\S+\/v2 right now, though it did/);
  assert.ok(err.cause instanceof ResourceNotInstalledError, String(err.cause));
  // A client that never saw it served: a setup mistake, named as before.
  await using fresh = await cluster.client();
  assert.ok(await fresh.list(res).catch((e) => e) instanceof ResourceNotInstalledError);
});

test("k8s failures: a server that never answers → StoreUnavailableError after the timeout", async () => {
  const server = await silentServer();
  try {
    await using client = await createKubeClient(connection(server.url), { requestTimeoutMs: 300 });
    const err = await client.list(CILIUM).catch((e) => e);
    assert.ok(err instanceof StoreUnavailableError, String(err));
    assert.match(err.message, /gave no answer within 300 ms/);
    const watch = await (async () => {
      for await (const _ of client.watch(CILIUM, { resourceVersion: "0" })) break;
    })().catch((e) => e);
    assert.ok(watch instanceof StoreUnavailableError, String(watch));
    const probe = await client.probe([{ resource: CILIUM, verbs: ["list"] }], { timeoutMs: 300 })
      .catch((e) => e);
    assert.ok(probe instanceof StoreUnavailableError, String(probe));
  } finally {
    await server.close();
  }
});

k8sTest("probe: Kubernetes, installed, allowed; else the first problem, typed", async () => {
  const cluster = await sharedKubeApiServer();
  const identities = await cluster.installIdentityCrd();
  const endpointsGroup = `e${crypto.randomUUID().slice(0, 8)}.idalloc.test`;
  const endpoints = {
    group: endpointsGroup,
    version: "v2",
    plural: "ciliumendpoints",
    namespaced: true,
  };
  const targets = [
    { resource: identities, verbs: ["get", "list", "watch", "create", "patch", "delete"] as const },
    { resource: endpoints, verbs: ["list"] as const, allNamespaces: true, optional: true },
  ].map((t) => ({ ...t, verbs: [...t.verbs] }));
  await using admin = await cluster.client();
  const report = await admin.probe(targets);
  assert.equal(report.version.gitVersion, "v1.20.2");
  assert.deepEqual(report.missing, [endpoints]);
  await cluster.installCrd(endpointCrd(endpointsGroup));
  assert.deepEqual((await admin.probe(targets)).missing, []);

  // The reader may only read Cilium's own identities: grant it reads on this copy too.
  await cluster.grant("reader", [{
    apiGroups: [identities.group],
    resources: ["ciliumidentities"],
    verbs: ["get", "list", "watch"],
  }]);
  await using reader = await cluster.client("reader");
  let denied: unknown;
  await eventually(async () => {
    denied = await reader.probe(targets).catch((e) => e);
    return denied instanceof StoreAccessDeniedError && /may not create/.test(denied.message);
  }, "the reader's role applies");
  assert.match(
    (denied as Error).message,
    new RegExp(
      `may not create, patch, delete ciliumidentities\\.${
        identities.group.replaceAll(".", "\\.")
      } ` +
        `cluster-wide .*add the rule \\{apiGroups: \\["${
          identities.group.replaceAll(".", "\\.")
        }"\\], ` +
        `resources: \\["ciliumidentities"\\], verbs: \\["create", "patch", "delete"\\]\\}`,
    ),
  );

  await using nobody = await cluster.client("nobody");
  const all = await nobody.probe(targets).catch((e) => e);
  assert.ok(all instanceof StoreAccessDeniedError, String(all));
  assert.match(all.message, /^user "nobody" may not get, list, watch, create, patch, delete /);

  const missing = await admin.probe([{
    resource: identityResource("absent.idalloc.test"),
    verbs: ["list"],
  }])
    .catch((e) => e);
  assert.ok(missing instanceof ResourceNotInstalledError, String(missing));
});

test("k8s failures: transport errors of both stacks are classified", () => {
  const ctx = { server: "https://api.example.test:6443", source: "kubeconfig /k" };
  const deno = (reason: string) =>
    new TypeError("fetch failed", {
      cause: new Error(
        `error sending request for url (https://api.example.test:6443/version): client error (Connect): ${reason}`,
      ),
    });
  const node = (code: string, message: string) => Object.assign(new Error(message), { code });
  const host = transportFailure(
    deno("dns error: failed to lookup address information: Name or service not known"),
    ctx,
    {},
  );
  assert.ok(host instanceof StoreHostNotFoundError);
  assert.equal(host.host, "api.example.test");
  assert.ok(
    transportFailure(
      node("ENOTFOUND", "getaddrinfo ENOTFOUND api.example.test"),
      ctx,
      {},
    ) instanceof
      StoreHostNotFoundError,
  );
  assert.ok(
    transportFailure(
      deno("tcp connect error: Connection refused (os error 111)"),
      ctx,
      {},
    ) instanceof
      StoreConnectionRefusedError,
  );
  const name = transportFailure(
    deno("invalid peer certificate: NotValidForName"),
    ctx,
    {},
  ) as StoreTlsError;
  assert.equal(name.problem, "name-mismatch");
  assert.match(name.message, /not valid for the name api\.example\.test/);
  const reset = transportFailure(node("ECONNRESET", "socket hang up"), ctx, {});
  assert.ok(reset instanceof StoreUnavailableError);
  assert.match(reset.message, /closed the connection without an answer/);
  // Closed before one byte of TLS (an API server still starting): unavailable, not "not TLS".
  const early = transportFailure(
    node(
      "ECONNRESET",
      "Client network socket disconnected before secure TLS connection was established",
    ),
    ctx,
    {},
  );
  assert.ok(early instanceof StoreUnavailableError, String(early));
  assert.match(early.message, /closed the connection without an answer/);
  const eof = transportFailure(deno("tls handshake eof"), ctx, {});
  assert.ok(eof instanceof StoreUnavailableError, String(eof));
  // A peer that answered in plain text: not TLS, a setup mistake.
  const plain = transportFailure(
    node("EPROTO", "SSL routines:ssl3_get_record:wrong version number"),
    ctx,
    {},
  ) as StoreTlsError;
  assert.ok(plain instanceof StoreTlsError, String(plain));
  assert.equal(plain.problem, "not-tls");
  const rustls = transportFailure(
    deno("received corrupt message of type InvalidContentType"),
    ctx,
    {},
  );
  assert.equal((rustls as StoreTlsError).problem, "not-tls");
});
