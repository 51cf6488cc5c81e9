/**
 * Every kubeconfig kubectl accepts, against a real kube-apiserver: `exec` credential plugins
 * (shell scripts printing an ExecCredential: v1 and v1beta1, a token or a client certificate,
 * `args`, `env`, `provideClusterInfo`, expiry → run again, 401 → run again and retry, a missing
 * program's `installHint`, `interactiveMode: Always`), `KUBECONFIG=a:b` merged by kubectl's rules
 * (and a missing first file), and `proxy-url` through a CONNECT proxy on loopback.
 */
import assert from "node:assert/strict";
import { chmod, copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { createKubeClient } from "../../../src/backends/k8s/client.ts";
import { CredentialPluginError } from "../../../src/backends/k8s/errors.ts";
import { loadKubeconfig } from "../../../src/backends/k8s/kubeconfig.ts";
import {
  identityResource,
  type KubeTestCluster,
  sharedKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { apiServerTests } from "./_client_support.ts";
import { startConnectProxy } from "./_proxies.ts";
import { makeCerts } from "../../_support/tls.ts";

const k8sTest = apiServerTests("kubeconfig");
const CILIUM = identityResource();
const V1 = "client.authentication.k8s.io/v1";
const V1BETA1 = "client.authentication.k8s.io/v1beta1";

async function withDir(body: (dir: string) => Promise<void>): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "idalloc-k8s-kubeconfig-"));
  try {
    await body(dir);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** Runs `body` with `$KUBECONFIG` set to `value`, then puts it back. */
async function withKubeconfigEnv(value: string, body: () => Promise<void>): Promise<void> {
  const before = process.env.KUBECONFIG;
  process.env.KUBECONFIG = value;
  try {
    await body();
  } finally {
    if (before === undefined) delete process.env.KUBECONFIG;
    else process.env.KUBECONFIG = before;
  }
}

/**
 * A plugin script in `dir`: each run appends a line to `runs`, saves `KUBERNETES_EXEC_INFO`, its
 * arguments and `$GREETING` to `info.json`/`args`/`greeting`, and prints `status` (JSON text with
 * `$N`, the run's number, and `$EXP`, a time `expiresInS` seconds ahead, substituted).
 */
async function plugin(dir: string, apiVersion: string, status: string, expiresInS = 0) {
  const script = join(dir, "plugin.sh");
  await writeFile(
    script,
    `#!/bin/sh
echo run >> "${dir}/runs"
N=$(wc -l < "${dir}/runs" | tr -d ' ')
EXP=$(date -u -d "+${expiresInS} seconds" +%Y-%m-%dT%H:%M:%SZ)
printf '%s' "$KUBERNETES_EXEC_INFO" > "${dir}/info.json"
echo "$@" > "${dir}/args"
echo "$GREETING" > "${dir}/greeting"
cat <<JSON
{"apiVersion": "${apiVersion}", "kind": "ExecCredential", "status": ${status}}
JSON
`,
  );
  await chmod(script, 0o755);
  return {
    script,
    runs: async () =>
      (await readFile(join(dir, "runs"), "utf8").catch(() => "")).split("\n").filter(Boolean)
        .length,
    info: async () => JSON.parse(await readFile(join(dir, "info.json"), "utf8")),
    file: (name: string) => readFile(join(dir, name), "utf8").then((t) => t.trim()),
  };
}

/** A kubeconfig in `dir` whose user runs `exec` (YAML flow text). */
async function execKubeconfig(
  cluster: KubeTestCluster,
  dir: string,
  exec: string,
  clusterExtra = "",
): Promise<string> {
  const path = join(dir, "config");
  await copyFile(cluster.caFile, join(dir, "ca.crt"));
  await writeFile(
    path,
    `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "${cluster.server}", certificate-authority: ca.crt${clusterExtra}}
users:
- name: u
  user:
    exec: ${exec}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`,
  );
  return path;
}

for (const version of [V1, V1BETA1]) {
  k8sTest(`exec plugin ${version.split("/")[1]}: token, args, env, cluster info`, async () => {
    const cluster = await sharedKubeApiServer();
    await withDir(async (dir) => {
      const p = await plugin(dir, version, `{"token": "${cluster.token("admin")}"}`);
      const path = await execKubeconfig(
        cluster,
        dir,
        `{apiVersion: ${version}, command: ./plugin.sh, args: [get-token, --cluster, c], ` +
          `env: [{name: GREETING, value: hello}], provideClusterInfo: true, ` +
          `interactiveMode: IfAvailable}`,
      );
      const conn = await loadKubeconfig(path);
      assert.equal(conn.exec?.command, p.script); // relative to the kubeconfig's folder
      await using client = await createKubeClient(conn);
      const list = await client.list(CILIUM, { limit: 1 });
      assert.ok(list.resourceVersion);
      await client.list(CILIUM, { limit: 1 });
      assert.equal(await p.runs(), 1, "a credential without expiry is kept");
      assert.equal(await p.file("args"), "get-token --cluster c");
      assert.equal(await p.file("greeting"), "hello");
      const info = await p.info();
      assert.equal(info.apiVersion, version);
      assert.equal(info.kind, "ExecCredential");
      assert.equal(info.spec.interactive, false);
      assert.equal(info.spec.cluster.server, cluster.server);
      assert.equal(
        atob(info.spec.cluster["certificate-authority-data"]),
        await readFile(cluster.caFile, "utf8"),
      );
    });
  });
}

k8sTest("exec plugin: an expired credential is fetched again", async () => {
  const cluster = await sharedKubeApiServer();
  await withDir(async (dir) => {
    const p = await plugin(
      dir,
      V1,
      `{"token": "${cluster.token("admin")}", "expirationTimestamp": "$EXP"}`,
      2,
    );
    const path = await execKubeconfig(cluster, dir, `{apiVersion: ${V1}, command: ${p.script}}`);
    await using client = await createKubeClient(await loadKubeconfig(path));
    await client.list(CILIUM, { limit: 1 });
    await client.list(CILIUM, { limit: 1 });
    assert.equal(await p.runs(), 1, "kept until it expires");
    await new Promise((resolve) => setTimeout(resolve, 3000));
    await client.list(CILIUM, { limit: 1 });
    assert.equal(await p.runs(), 2, "run again once expired");
  });
});

k8sTest("exec plugin: a refused token (401) runs the plugin again and retries", async () => {
  const cluster = await sharedKubeApiServer();
  await withDir(async (dir) => {
    // The first run prints a token the server does not know; later runs the real one.
    const p = await plugin(
      dir,
      V1,
      `{"token": "$( [ "$N" = 1 ] && echo stale || echo ${cluster.token("admin")} )"}`,
    );
    const path = await execKubeconfig(cluster, dir, `{apiVersion: ${V1}, command: ${p.script}}`);
    await using client = await createKubeClient(await loadKubeconfig(path));
    const list = await client.list(CILIUM, { limit: 1 });
    assert.ok(list.resourceVersion);
    assert.equal(await p.runs(), 2);
  });
});

k8sTest("exec plugin: a client certificate", async () => {
  const cluster = await sharedKubeApiServer();
  const cert = await cluster.clientCertificate("exec-cert-user", ["system:masters"]);
  await withDir(async (dir) => {
    const status = JSON.stringify({ clientCertificateData: cert.cert, clientKeyData: cert.key });
    const p = await plugin(dir, V1, status);
    const path = await execKubeconfig(cluster, dir, `{apiVersion: ${V1}, command: ${p.script}}`);
    await using client = await createKubeClient(await loadKubeconfig(path));
    const list = await client.list(CILIUM, { limit: 1 });
    assert.ok(list.resourceVersion);
    assert.equal(await p.runs(), 1);
  });
});

k8sTest("exec plugin: not installed (installHint), interactive only, bad output", async () => {
  const cluster = await sharedKubeApiServer();
  await withDir(async (dir) => {
    const cases: [string, RegExp][] = [
      [
        `{apiVersion: ${V1}, command: idalloc-no-such-plugin, installHint: "brew install it"}`,
        /exec plugin 'idalloc-no-such-plugin' is not installed \(not found on PATH\): brew install it/,
      ],
      [
        `{apiVersion: ${V1}, command: /bin/true, interactiveMode: Always}`,
        /needs a terminal \(interactiveMode: Always\)/,
      ],
      [`{apiVersion: ${V1}, command: /bin/true}`, /printed no JSON ExecCredential/],
      [`{apiVersion: ${V1}, command: /bin/false}`, /exited with 1/],
    ];
    for (const [exec, message] of cases) {
      const path = await execKubeconfig(cluster, dir, exec);
      await using client = await createKubeClient(await loadKubeconfig(path));
      await assert.rejects(
        client.list(CILIUM, { limit: 1 }),
        (err) => err instanceof CredentialPluginError && message.test(err.message),
        exec,
      );
    }
    const p = await plugin(dir, V1BETA1, `{"token": "x"}`);
    const path = await execKubeconfig(cluster, dir, `{apiVersion: ${V1}, command: ${p.script}}`);
    await using client = await createKubeClient(await loadKubeconfig(path));
    await assert.rejects(client.list(CILIUM, { limit: 1 }), /answered .*v1beta1, not .*\/v1$/);
  });
});

/** A kubeconfig file's text: one cluster, user and context, each named as given. */
function configText(o: {
  cluster: string;
  server: string;
  ca: string;
  user: string;
  token: string;
  context: string;
  namespace: string;
  current?: string;
}): string {
  return `apiVersion: v1
kind: Config
clusters:
- name: ${o.cluster}
  cluster: {server: "${o.server}", certificate-authority: ${o.ca}}
users:
- name: ${o.user}
  user: {token: "${o.token}"}
contexts:
- name: ${o.context}
  context: {cluster: ${o.cluster}, user: ${o.user}, namespace: ${o.namespace}}
${o.current === undefined ? "" : `current-context: ${o.current}`}
`;
}

k8sTest("KUBECONFIG=a:b is merged as kubectl merges it; a missing file is skipped", async () => {
  const cluster = await sharedKubeApiServer();
  await withDir(async (dir) => {
    await mkdir(join(dir, "a"));
    await mkdir(join(dir, "b"));
    // a names the cluster "c" with its CA relative to a's folder, and sets current-context "x".
    await copyFile(cluster.caFile, join(dir, "a", "ca-a.crt"));
    const a = join(dir, "a", "config");
    await writeFile(
      a,
      configText({
        cluster: "c",
        server: cluster.server,
        ca: "ca-a.crt",
        user: "u",
        token: cluster.token("admin"),
        context: "x",
        namespace: "from-a",
        current: "x",
      }),
    );
    // b names "c" again (a wrong server and user token: the first file wins), its own cluster
    // "d" and context "z", and "y" as its current context (ignored: a set one first); b's CA
    // path is relative to b's folder.
    await copyFile(cluster.caFile, join(dir, "b", "ca-b.crt"));
    const b = join(dir, "b", "config");
    await writeFile(
      b,
      `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", certificate-authority: ca-b.crt}
- name: d
  cluster: {server: "${cluster.server}", certificate-authority: ca-b.crt}
users:
- name: u
  user: {token: wrong}
- name: admin-b
  user: {token: "${cluster.token("admin")}"}
contexts:
- name: y
  context: {cluster: c, user: u, namespace: from-b}
- name: z
  context: {cluster: d, user: admin-b, namespace: from-z}
current-context: y
`,
    );
    await withKubeconfigEnv(`${a}:${b}`, async () => {
      const conn = await loadKubeconfig();
      assert.equal(conn.namespace, "from-a", "current-context from the first file that sets it");
      assert.equal(conn.server, cluster.server, "the first file to name cluster c wins");
      assert.match(conn.source, new RegExp(`kubeconfig ${a}:${b} \\(context x, user u\\)`));
      await using client = await createKubeClient(conn);
      assert.ok((await client.list(CILIUM, { limit: 1 })).resourceVersion);
      // A context of the second file, its cluster's CA relative to b's folder.
      const z = await loadKubeconfig(undefined, "z");
      assert.equal(z.namespace, "from-z");
      await using clientZ = await createKubeClient(z);
      assert.ok((await clientZ.list(CILIUM, { limit: 1 })).resourceVersion);
    });
    await withKubeconfigEnv(`${join(dir, "missing")}:${b}`, async () => {
      const conn = await loadKubeconfig();
      assert.equal(conn.namespace, "from-b", "the missing first file is skipped");
    });
    await withKubeconfigEnv(`${join(dir, "missing")}:${join(dir, "gone")}`, async () => {
      await assert.rejects(loadKubeconfig(), /no kubeconfig: .*missing, .*gone do not exist/);
    });
  });
});

k8sTest("proxy-url: the client reaches the server through a CONNECT proxy", async () => {
  const cluster = await sharedKubeApiServer();
  await using proxy = await startConnectProxy();
  await withDir(async (dir) => {
    await copyFile(cluster.caFile, join(dir, "ca.crt"));
    const path = join(dir, "config");
    await writeFile(
      path,
      configText({
        cluster: "c",
        server: cluster.server,
        ca: "ca.crt",
        user: "u",
        token: cluster.token("admin"),
        context: "x",
        namespace: "default",
        current: "x",
      }).replace(
        "certificate-authority: ca.crt",
        `certificate-authority: ca.crt, proxy-url: "http://${proxy.address}"`,
      ),
    );
    const conn = await loadKubeconfig(path);
    assert.equal(conn.proxyUrl, `http://${proxy.address}`);
    await using client = await createKubeClient(conn);
    assert.ok((await client.list(CILIUM, { limit: 1 })).resourceVersion);
    assert.ok(proxy.accepted >= 1, "the connection went through the proxy");
  });
});

k8sTest(
  "the kubeconfig's CA replaces the runtime's roots, as client-go trusts only it",
  async () => {
    const cluster = await sharedKubeApiServer();
    await withDir(async (dir) => {
      const other = await makeCerts(dir);
      const child = new URL("./_ca_child.ts", import.meta.url).pathname;
      const run = async (caFile: string) => {
        const out = await new Deno.Command(Deno.execPath(), {
          args: ["run", "-A", child],
          // The runtime's roots trust the server's real CA: only the kubeconfig's may count.
          env: { DENO_CERT: cluster.caFile, SERVER: cluster.server, CA_FILE: caFile },
          stdout: "piped",
          stderr: "piped",
        }).output();
        return new TextDecoder().decode(out.stdout).trim() ||
          new TextDecoder().decode(out.stderr).trim();
      };
      assert.equal(await run(cluster.caFile), "ok");
      assert.match(await run(other.ca), /^StoreTlsError: /);
    });
  },
);
