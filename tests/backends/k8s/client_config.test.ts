/**
 * Connecting as users do, against a real kube-apiserver: kubeconfig files (token, client
 * certificate as files and inline, insecure-skip-tls-verify, the current or a named context,
 * tokenFile) and the in-cluster service account from injected paths, with a rotated token.
 */
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createKubeClient } from "../../../src/backends/k8s/client.ts";
import {
  inClusterConnection,
  loadKubeconfig,
  parseKubeconfig,
} from "../../../src/backends/k8s/kubeconfig.ts";
import {
  identityResource,
  sharedKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { InvalidOptionsError, StoreAccessDeniedError } from "../../../src/errors.ts";
import { eventually } from "../../_support/eventually.ts";
import { test } from "../../_support/test.ts";
import { apiServerTests } from "./_client_support.ts";

const k8sTest = apiServerTests("config");

const CILIUM = identityResource();

/** A temp dir removed afterwards. */
async function withDir(body: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "idalloc-k8s-config-"));
  try {
    await body(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

k8sTest("kubeconfig with a token and a CA file: the current context, or a named one", async () => {
  const cluster = await sharedKubeApiServer();
  const path = await cluster.kubeconfig("admin", { context: "dev", namespace: "team-a" });
  // The file's current-context is "other" (namespace "other"); "dev" is named.
  const current = await loadKubeconfig(path);
  assert.equal(current.namespace, "other");
  assert.match(current.source, /context other/);
  const named = await loadKubeconfig(path, "dev");
  assert.equal(named.namespace, "team-a");
  assert.equal(named.server, cluster.server);
  await using client = await createKubeClient(named);
  assert.equal(client.namespace, "team-a");
  const list = await client.list(CILIUM, { limit: 1 });
  assert.ok(list.resourceVersion);
});

k8sTest("a context without a namespace: namespace 'default'", async () => {
  const cluster = await sharedKubeApiServer();
  const path = await cluster.kubeconfig("reader", { context: "plain" });
  const conn = await loadKubeconfig(path, "plain");
  assert.equal(conn.namespace, "default");
});

k8sTest("kubeconfig with a client certificate, as files and inline", async () => {
  const cluster = await sharedKubeApiServer();
  for (const inline of [false, true]) {
    const path = await cluster.kubeconfig("admin", {
      context: "cert",
      inline,
      clientCertificate: { user: "cert-admin", groups: ["system:masters"] },
    });
    const conn = await loadKubeconfig(path, "cert");
    assert.equal(conn.token, undefined);
    assert.match(conn.cert ?? "", /BEGIN CERTIFICATE/);
    await using client = await createKubeClient(conn);
    await client.list(CILIUM, { limit: 1 });
  }
});

k8sTest("a client certificate the server does not map to rights: 403 names the user", async () => {
  const cluster = await sharedKubeApiServer();
  const path = await cluster.kubeconfig("admin", {
    context: "cert",
    clientCertificate: { user: "cert-nobody" },
  });
  await using client = await createKubeClient(await loadKubeconfig(path, "cert"));
  const err = await client.list(CILIUM, { limit: 1 }).catch((e) => e);
  assert.ok(err instanceof StoreAccessDeniedError, String(err));
  assert.match(err.message, /user "cert-nobody" may not list ciliumidentities\.cilium\.io/);
});

k8sTest("insecure-skip-tls-verify: no CA, still connects", async () => {
  const cluster = await sharedKubeApiServer();
  const path = await cluster.kubeconfig("admin", { context: "insecure", insecure: true });
  const conn = await loadKubeconfig(path, "insecure");
  assert.equal(conn.insecureSkipTlsVerify, true);
  assert.equal(conn.ca, undefined);
  await using client = await createKubeClient(conn);
  assert.equal((await client.version()).major, "1");
  await client.list(CILIUM, { limit: 1 });
});

k8sTest("tokenFile, relative to the kubeconfig", async () => {
  const cluster = await sharedKubeApiServer();
  await withDir(async (dir) => {
    await writeFile(join(dir, "token"), `${cluster.token("admin")}\n`);
    const path = join(dir, "config");
    await writeFile(
      path,
      `apiVersion: v1
clusters: [{name: c, cluster: {server: "${cluster.server}", certificate-authority: "${cluster.caFile}"}}]
users: [{name: u, user: {tokenFile: token}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
    );
    const conn = await loadKubeconfig(path);
    assert.equal(conn.tokenFile, join(dir, "token"));
    await using client = await createKubeClient(conn);
    await client.list(CILIUM, { limit: 1 });
  });
});

test("k8s config: kubeconfig mistakes are InvalidOptionsError in words", async () => {
  const base = `apiVersion: v1
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`;
  const cases: [string, string | undefined, RegExp][] = [
    [
      `${base}users: [{name: u, user: {token: t}}]`,
      "nope",
      /no context named 'nope' \(it has 'x'\)/,
    ],
    [`${base}users: []`, undefined, /no user named 'u'/],
    [
      `${base}users: [{name: u, user: {exec: {command: aws}}}]`,
      undefined,
      /is not a kubeconfig: 'users\.0\.user\.exec\.apiVersion'/,
    ],
    [
      `${base}users: [{name: u, user: {exec: {command: aws, apiVersion: ` +
      `client.authentication.k8s.io/v1alpha1}}}]`,
      undefined,
      /apiVersion 'client\.authentication\.k8s\.io\/v1alpha1' is not supported/,
    ],
    [
      `${base}users: [{name: u, user: {auth-provider: {name: gcp}}}]`,
      undefined,
      /auth-provider 'gcp' is not supported .*gke-gcloud-auth-plugin/,
    ],
    [
      `${base}users: [{name: u, user: {auth-provider: {name: azure}}}]`,
      undefined,
      /auth-provider 'azure' is not supported .*kubelogin convert-kubeconfig/,
    ],
    [
      `${base}users: [{name: u, user: {auth-provider: {name: oidc, config: {}}}}]`,
      undefined,
      /auth-provider 'oidc' has no id-token.*kubelogin/,
    ],
    [
      base.replace('6443"', '6443", proxy-url: "ftp://p:1"') +
      "users: [{name: u, user: {token: t}}]",
      undefined,
      /proxy-url 'ftp:\/\/p:1' is not an http:\/\/, https:\/\/ or socks5:\/\/ URL/,
    ],
    [
      `${base}users: [{name: u, user: {client-certificate-data: eA==}}]`,
      undefined,
      /a client certificate needs its key/,
    ],
    [
      `${base}users: [{name: u, user: {token: t}}]`.replace("current-context: x", ""),
      undefined,
      /has no current-context/,
    ],
    ["clusters: [{name: c}]", "x", /is not a kubeconfig: 'clusters\.0\.cluster'/],
    ["a: [", undefined, /is not valid YAML/],
    [
      base.replace("https://127.0.0.1:6443", "ftp://x") + "users: [{name: u, user: {token: t}}]",
      undefined,
      /is not an http\(s\) URL/,
    ],
  ];
  for (const [text, context, message] of cases) {
    await assert.rejects(
      parseKubeconfig(text, "/k/config", context),
      (err) => err instanceof InvalidOptionsError && message.test(err.message),
      text,
    );
  }
  await assert.rejects(
    loadKubeconfig("/nonexistent/kubeconfig"),
    /kubeconfig \/nonexistent\/kubeconfig: cannot read the file/,
  );
});

k8sTest("in-cluster config from injected paths; a rotated token is read again", async () => {
  const cluster = await sharedKubeApiServer();
  await using admin = await cluster.client();
  const ns = `sa-${crypto.randomUUID().slice(0, 8)}`;
  await admin.create({ group: "", version: "v1", plural: "namespaces", namespaced: false }, {
    apiVersion: "v1",
    kind: "Namespace",
    metadata: { name: ns },
  });
  const accounts = { group: "", version: "v1", plural: "serviceaccounts", namespaced: true };
  await admin.create(accounts, {
    apiVersion: "v1",
    kind: "ServiceAccount",
    metadata: { name: "idalloc" },
  }, {
    namespace: ns,
  });
  // A real service-account token (TokenRequest), as the kubelet mounts it.
  const tokenRequest = async () => {
    const answer = await admin.create(
      { group: "", version: "v1", plural: "serviceaccounts/idalloc/token", namespaced: true },
      {
        apiVersion: "authentication.k8s.io/v1",
        kind: "TokenRequest",
        metadata: {},
        spec: { expirationSeconds: 3600 },
      },
      { namespace: ns },
    );
    return (answer.status as { token: string }).token;
  };
  await cluster.grant(`system:serviceaccount:${ns}:idalloc`, [{
    apiGroups: ["cilium.io"],
    resources: ["ciliumidentities"],
    verbs: ["list"],
  }]);
  await withDir(async (dir) => {
    const paths = {
      tokenFile: join(dir, "token"),
      caFile: join(dir, "ca.crt"),
      namespaceFile: join(dir, "namespace"),
      env: {
        KUBERNETES_SERVICE_HOST: "127.0.0.1",
        KUBERNETES_SERVICE_PORT: new URL(cluster.server).port,
      },
    };
    await writeFile(paths.tokenFile, "not-a-token");
    await writeFile(paths.caFile, await readFile(cluster.caFile, "utf8"));
    await writeFile(paths.namespaceFile, ns);
    const conn = await inClusterConnection(paths);
    assert.equal(conn.namespace, ns);
    assert.equal(conn.server, cluster.server);
    assert.equal(conn.source, "in-cluster config");
    await using client = await createKubeClient(conn);
    const refused = await client.list(CILIUM, { limit: 1 }).catch((e) => e);
    assert.ok(refused instanceof StoreAccessDeniedError, String(refused));
    assert.match(refused.message, /401 Unauthorized/);
    // The kubelet rotates the token: the next call reads the new one, without a new client.
    await writeFile(paths.tokenFile, await tokenRequest());
    await eventually(
      () => client.list(CILIUM, { limit: 1 }).then(() => true, () => false),
      "the service account's rights apply",
    );
  });
});

test("k8s config: in-cluster outside a pod, or without its token, says so", async () => {
  await assert.rejects(
    inClusterConnection({ env: {} }),
    (err) =>
      err instanceof InvalidOptionsError && /not running in a Kubernetes pod/.test(err.message),
  );
  await assert.rejects(
    inClusterConnection({
      env: { KUBERNETES_SERVICE_HOST: "127.0.0.1", KUBERNETES_SERVICE_PORT: "6443" },
      tokenFile: "/nonexistent/token",
    }),
    /cannot read the service-account token \/nonexistent\/token/,
  );
});
