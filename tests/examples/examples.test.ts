/**
 * Every example runs as its `deno task`, as a user would start it, and says what it should.
 */
import assert from "node:assert/strict";
import { etcdUnavailable } from "../_support/etcd.ts";

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
