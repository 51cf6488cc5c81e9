/**
 * Every example runs as its `deno task`, as a user would start it, and says what it should.
 */
import assert from "node:assert/strict";
import { etcdUnavailable, freePort, startEtcd } from "../../src/backends/etcd/testing/cluster.ts";
import { rawClient } from "../../src/backends/etcd/testing/fixture.ts";
import {
  identityResource,
  kubeApiserverUnavailable,
  startKubeApiServer,
} from "../../src/backends/k8s/testing/cluster.ts";
import { enableAuth } from "../_support/etcd_auth.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
/** A hung example fails the test instead of hanging CI. */
const KILL_AFTER_MS = 60_000;

interface TaskResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

async function task(name: string, args: string[] = [], env?: Record<string, string>) {
  const killer = new AbortController();
  const timer = setTimeout(() => killer.abort(), KILL_AFTER_MS);
  try {
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["task", "-q", name, ...args],
      cwd: ROOT,
      env,
      stdout: "piped",
      stderr: "piped",
      signal: killer.signal,
    }).output();
    const result: TaskResult = {
      code: out.code,
      stdout: new TextDecoder().decode(out.stdout),
      stderr: new TextDecoder().decode(out.stderr),
    };
    assert.ok(!killer.signal.aborted, `deno task ${name} hung:\n${result.stdout}`);
    return result;
  } finally {
    clearTimeout(timer);
  }
}

Deno.test("quickstart: one allocator on a KV file; a second run finds the same IDs", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-quickstart-" });
  try {
    const first = await task("quickstart", [`${dir}/ids.kv`]);
    assert.equal(first.code, 0, first.stderr);
    const web = /app=web; → ID (\d+) \(isNew: true, firstUse: true\)/.exec(first.stdout);
    assert.ok(web, first.stdout);
    assert.match(
      first.stdout,
      new RegExp(`app=web; → ID ${web[1]} \\(isNew: false, firstUse: false\\)`),
    );
    assert.match(
      first.stdout,
      new RegExp(`maps app=web; to ${web[1]}, and ${web[1]} back to app=web;`),
    );
    assert.match(first.stdout, /release app=web; twice: \{ lastUse: false \} \{ lastUse: true \}/);
    const second = await task("quickstart", [`${dir}/ids.kv`]);
    assert.match(
      second.stdout,
      new RegExp(`app=web; → ID ${web[1]} \\(isNew: false, firstUse: true\\)`),
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

function assertClusterRun(result: TaskResult): void {
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  assert.match(result.stdout, /✔ 4 nodes got one ID for app=web;/);
  assert.match(result.stdout, /lastUse true/);
  assert.match(result.stdout, /✔ GC reclaimed app=jobs; app=batch; app=cron;/);
  assert.match(result.stdout, /✔ app=web; keeps ID \d+/);
  assert.doesNotMatch(result.stdout, /✘/);
  assert.match(result.stdout, /all checks passed/);
}

Deno.test("demo (= cluster): node processes agree, release, one is killed, GC reclaims", async () => {
  assertClusterRun(await task("demo"));
});

Deno.test("etcd: the cluster scenario on a private etcd, or a polite skip", async () => {
  const result = await task("etcd", [], { ETCD_ENDPOINTS: "" });
  if (etcdUnavailable() !== undefined) {
    assert.equal(result.code, 0);
    assert.match(result.stdout, /^skipped: no etcd/);
    return;
  }
  assert.match(result.stdout, /started a private etcd at http:\/\/127\.0\.0\.1:\d+/);
  assertClusterRun(result);
});

Deno.test("identity: labels, reserved and CIDR identities, a remote cluster", async () => {
  const result = await task("identity");
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  assert.match(result.stdout, /reserved:host → 1\n/);
  assert.match(result.stdout, /cidr:10\.0\.0\.0\/8,reserved:world → 16777217 \(0x1000001\)/);
  assert.match(result.stdout, /✔ lookup by the remote ID/);
  assert.match(
    result.stdout,
    /✔ live: k8s:app=cache,k8s:io\.cilium\.k8s\.policy\.cluster=cluster-2/,
  );
  assert.doesNotMatch(result.stdout, /✘/);
  assert.match(result.stdout, /all checks passed/);
});

/** An ordinary mistake: exit 1 and one line on stderr that says it, never a stack trace. */
function assertMistake(result: TaskResult, example: string, says: RegExp): void {
  const lines = result.stderr.trim().split("\n");
  assert.equal(result.code, 1, result.stderr);
  assert.equal(lines.length, 1, `one line, got:\n${result.stderr}`);
  assert.match(lines[0], new RegExp(`^${example}: `));
  assert.match(lines[0], says);
}

Deno.test({
  name: "etcd: etcdctl's host:port in ETCD_ENDPOINTS works, and the run removes what it wrote",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    await using etcd = await startEtcd();
    const address = new URL(etcd.endpoints[0]).host;
    const result = await task("etcd", [], { ETCD_ENDPOINTS: address });
    assertClusterRun(result);
    const prefix = /Cilium's layout under (idalloc-example\/[0-9a-f]+):/.exec(result.stdout)?.[1];
    assert.ok(prefix, result.stdout);
    assert.match(
      result.stdout,
      new RegExp(`removed the example's \\d+ IDs from etcd \\(${prefix} is empty\\)`),
    );
    const client = rawClient(etcd.endpoints);
    try {
      assert.deepEqual(await client.getAll().prefix("idalloc-example/").keys(), []);
    } finally {
      client.close();
    }
  },
});

Deno.test("etcd: a bad ETCD_ENDPOINTS or an etcd that is not there is one line, exit 1", async () => {
  assertMistake(
    await task("etcd", [], { ETCD_ENDPOINTS: "etcd one" }),
    "etcd",
    /ETCD_ENDPOINTS takes comma-separated client URLs .* or host:port: .*'endpoints\.0'/,
  );
  // Nothing listens on a free port: refused, in plain words, with the endpoint.
  const port = await freePort();
  assertMistake(
    await task("etcd", [], { ETCD_ENDPOINTS: `127.0.0.1:${port}` }),
    "etcd",
    new RegExp(`http://127\\.0\\.0\\.1:${port}`),
  );
});

Deno.test({
  name: "etcd: an etcd with authentication on is one line, exit 1, at once (it hung)",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    await using etcd = await startEtcd();
    await enableAuth(etcd.endpoints, "s3cret");
    // `task` fails the test if the example runs into its minute: it used to wait forever, its
    // node processes on a watch that etcd refused.
    assertMistake(
      await task("etcd", [], { ETCD_ENDPOINTS: new URL(etcd.endpoints[0]).host }),
      "etcd",
      /refused access to prefix idalloc-example\/[0-9a-f]+\/: authentication is on and no user was given.*this example connects without a user/,
    );
  },
});

Deno.test("quickstart: a KV file that cannot be opened is one line, exit 1", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-quickstart-" });
  try {
    assertMistake(
      await task("quickstart", [`${dir}/missing/ids.kv`]),
      "quickstart",
      /cannot open Deno KV file .*missing\/ids\.kv \(the first argument\)/,
    );
    await Deno.writeTextFile(
      `${dir}/notes.txt`,
      "not a database, but long enough to be read as one",
    );
    assertMistake(
      await task("quickstart", [`${dir}/notes.txt`]),
      "quickstart",
      /cannot open Deno KV file .*notes\.txt \(the first argument\): file is not a database/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deploy:dev: a port in use or a PORT that is no port is one line, exit 1", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-deploy-" });
  using taken = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = taken.addr.port;
  try {
    const env = { IDALLOC_KV_PATH: `${dir}/deploy.kv` };
    assertMistake(
      await task("deploy:dev", [], { ...env, PORT: String(port) }),
      "deploy",
      new RegExp(`port ${port} on 127\\.0\\.0\\.1 is in use: set PORT to a free port`),
    );
    // A PORT that is no port is found before anything is opened: no KV file is left behind.
    await Deno.remove(`${dir}/deploy.kv`);
    for (const bad of ["abc", "70000", "-1"]) {
      assertMistake(
        await task("deploy:dev", [], { ...env, PORT: bad }),
        "deploy",
        new RegExp(`PORT must be a port number from 0 to 65535, not '${bad}'`),
      );
    }
    assert.deepEqual([...Deno.readDirSync(dir)], []);
    assertMistake(
      await task("deploy:dev", [], { IDALLOC_KV_PATH: `${dir}/missing/deploy.kv`, PORT: "0" }),
      "deploy",
      /cannot open Deno KV file .*missing\/deploy\.kv \(IDALLOC_KV_PATH\)/,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

function assertK8sRun(result: TaskResult): void {
  assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
  assert.match(result.stdout, /identities: ciliumidentities\.cilium\.io/);
  assert.match(result.stdout, /✔ both nodes answer \d+ for idalloc-example-[0-9a-f]{8}\/app=web;/);
  assert.match(result.stdout, /✔ the second node joins the same identity/);
  assert.match(
    result.stdout,
    /security-labels: \{"k8s:app":"web","k8s:idalloc\.io\/example-run":"[0-9a-f]{8}","k8s:io\.kubernetes\.pod\.namespace":"prod"\}/,
  );
  assert.match(result.stdout, /this run touches only what it makes: keys idalloc-example-/);
  assert.match(
    result.stdout,
    /removed what this run made, and nothing else: 4 identities, 4 key claims, \d+ node Leases/,
  );
  assert.doesNotMatch(result.stdout, /✘/);
  assert.match(result.stdout, /all checks passed/);
}

Deno.test("k8s: two nodes and a Cilium identity on a private API server, or a polite skip", async () => {
  const result = await task("k8s", [], { KUBECONFIG: "" });
  if (kubeApiserverUnavailable() !== undefined) {
    assert.equal(result.code, 0);
    assert.match(result.stdout, /^skipped: no Kubernetes API server/);
    return;
  }
  assert.match(result.stdout, /started a private kube-apiserver at https:\/\/127\.0\.0\.1:\d+/);
  assertK8sRun(result);
});

/** A CiliumIdentity made as a Cilium agent makes one (no endpoint yet, no mark). */
function foreignIdentity(id: number, app: string) {
  return {
    apiVersion: "cilium.io/v2",
    kind: "CiliumIdentity",
    metadata: { name: String(id), labels: { app } },
    "security-labels": { "k8s:app": app, "k8s:io.kubernetes.pod.namespace": "default" },
  };
}

Deno.test({
  name:
    "k8s: the cluster of KUBECONFIG: the run removes what it made and leaves the cluster's own identities alone",
  ignore: kubeApiserverUnavailable() !== undefined,
  fn: async () => {
    await using cluster = await startKubeApiServer();
    const kubeconfig = await cluster.kubeconfig("admin", { namespace: "default", current: true });
    await using client = await cluster.client("admin");
    // Cilium's: one fresh (an agent allocated it, its endpoint comes next), one marked unused
    // long ago by Cilium's operator (the operator's to delete, not the example's).
    await client.create(identityResource(), foreignIdentity(300, "foreign"));
    await client.create(identityResource(), {
      ...foreignIdentity(301, "stale"),
      metadata: {
        name: "301",
        annotations: { "io.cilium.heartbeat": "2020-01-01T00:00:00Z" },
      },
    });
    const result = await task("k8s", [], { KUBECONFIG: kubeconfig });
    assert.match(result.stdout, /using the cluster of KUBECONFIG/);
    assertK8sRun(result);
    assert.deepEqual(
      (await client.list(identityResource())).items.map((o) => o.metadata.name).sort(),
      ["300", "301"],
      "the cluster's own identities are left alone",
    );
  },
});

Deno.test({
  name: "k8s: SIGTERM cleans up what the run made, says so, and exits 130",
  ignore: kubeApiserverUnavailable() !== undefined || Deno.build.os !== "linux",
  fn: async () => {
    await using cluster = await startKubeApiServer();
    const kubeconfig = await cluster.kubeconfig("admin", { namespace: "default", current: true });
    await using client = await cluster.client("admin");
    await client.create(identityResource(), foreignIdentity(300, "foreign"));
    // The example's own process, as `deno task k8s` starts it (its signals reach it directly).
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "examples/k8s/main.ts"],
      cwd: ROOT,
      env: { KUBECONFIG: kubeconfig },
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const killer = setTimeout(() => child.kill("SIGKILL"), KILL_AFTER_MS);
    try {
      const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
      let stdout = "";
      while (!/both nodes answer/.test(stdout)) {
        const { value, done } = await reader.read();
        if (done) break;
        stdout += value;
      }
      child.kill("SIGTERM");
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        stdout += value;
      }
      const stderr = await new Response(child.stderr).text();
      const status = await child.status;
      assert.equal(status.code, 130, `${stdout}\n${stderr}`);
      assert.match(stderr, /k8s: SIGTERM: stopping the node processes and cleaning up/);
      assert.match(stdout, /removed what this run made, and nothing else: \d+ identities/);
      assert.deepEqual(
        (await client.list(identityResource())).items.map((o) => o.metadata.name),
        ["300"],
        "its identities went, the cluster's stayed",
      );
    } finally {
      clearTimeout(killer);
    }
  },
});
