/**
 * The test servers' launcher (`src/backends/k8s/testing/launcher.ts`), run as `deno task test`
 * and `deno task k8s:apiserver` run it: one kube-apiserver for every process of a run (two test
 * processes reach the same one, and neither may kill it), the command's exit code passed through,
 * SIGTERM passed on, and everything stopped and removed after; and the user's API server with the
 * walk-through it prints working as printed.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { alive } from "../../../src/testing/process_alive.ts";
import { kubeApiserverUnavailable } from "../../../src/backends/k8s/testing/cluster.ts";
import { main } from "../../../src/cli/main.ts";
import { Capture } from "../../cli/_run.ts";
import { userEnv } from "../../_support/commands.ts";
import { eventually } from "../../_support/eventually.ts";

const ROOT = new URL("../../../", import.meta.url).pathname;
const LAUNCHER = `${ROOT}src/backends/k8s/testing/launcher.ts`;
const PROBE = `${ROOT}tests/_support/kube_probe.ts`;
const ignore = kubeApiserverUnavailable() !== undefined;

/** A running launcher: its output so far, and its end. */
interface Launched {
  readonly process: Deno.ChildProcess;
  stdout: string;
  stderr: string;
  done: Promise<Deno.CommandStatus>;
}

function launch(args: string[]): Launched {
  const process = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", LAUNCHER, ...args],
    cwd: ROOT,
    env: userEnv(),
    clearEnv: true,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const run: Launched = { process, stdout: "", stderr: "", done: process.status };
  const read = async (stream: ReadableStream<Uint8Array>, key: "stdout" | "stderr") => {
    for await (const text of stream.pipeThrough(new TextDecoderStream())) run[key] += text;
  };
  const reading = Promise.all([read(process.stdout, "stdout"), read(process.stderr, "stderr")]);
  run.done = reading.then(() => process.status);
  return run;
}

/** A server's start, under a loaded machine. */
const START_MS = 180_000;

/** The `pid N` of the launcher's line about the shared server. */
function sharedPid(stderr: string): number {
  const m = /one kube-apiserver \(https:\/\/127\.0\.0\.1:\d+, pid (\d+)\)/.exec(stderr);
  assert.ok(m, stderr);
  return Number(m[1]);
}

Deno.test({
  name: "launcher test: two test processes share its one kube-apiserver; the exit code passes",
  ignore,
  async fn() {
    const probe = `"${Deno.execPath()}" run -A ${PROBE}`;
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", LAUNCHER, "test", "--", "sh", "-c", `${probe} && ${probe} && exit 7`],
      cwd: ROOT,
      env: userEnv(),
      clearEnv: true,
    }).output();
    const stdout = new TextDecoder().decode(out.stdout);
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 7, stderr);
    const seen = stdout.trim().split("\n").map((line) => JSON.parse(line));
    assert.equal(seen.length, 2, stdout);
    const pid = sharedPid(stderr);
    for (const s of seen) {
      // The launcher's server, not one of the process's own; it refuses to be killed.
      assert.equal(s.pid, pid);
      assert.equal(s.server, seen[0].server);
      assert.ok(s.namespaces >= 4);
      assert.equal(s.kill, "SharedKubeApiServerError");
    }
    assert.match(
      stderr,
      /left on the shared kube-apiserver: 0 CRDs \(and \d+ CRDs of \d+ emptied groups kept for reuse\) and 0 namespaces/,
    );
    assert.equal(alive(pid), false, "stopped with the launcher");
  },
});

Deno.test({
  name: "launcher test: SIGTERM goes to the command; the servers stop and their files go",
  ignore,
  async fn() {
    const run = launch(["test", "--", "sleep", "120"]);
    try {
      await eventually(
        () => /one kube-apiserver \(/.test(run.stderr),
        "the servers started",
        START_MS,
      );
      const pid = sharedPid(run.stderr);
      const dir = /run files in (\S+)\)/.exec(run.stderr)?.[1];
      assert.ok(dir !== undefined && existsSync(dir), run.stderr);
      run.process.kill("SIGTERM");
      const status = await run.done;
      assert.equal(status.code, 128 + 15, run.stderr);
      assert.equal(alive(pid), false);
      assert.equal(existsSync(dir), false, "the run's files are removed");
    } finally {
      try {
        run.process.kill("SIGKILL");
      } catch {
        // ended
      }
      await run.done;
    }
  },
});

Deno.test({
  name: "launcher apiserver: the printed KUBECONFIG and identity command work; Ctrl-C cleans up",
  ignore,
  async fn() {
    const run = launch(["apiserver"]);
    try {
      await eventually(
        () => /export KUBECONFIG=\S+/.test(run.stdout),
        "the walk-through",
        START_MS,
      );
      const kubeconfig = /export KUBECONFIG=(\S+)/.exec(run.stdout)![1];
      assert.match(run.stdout, /ciliumidentities\.cilium\.io/);
      assert.match(
        run.stdout,
        /deno task idalloc --store k8s:\$KUBECONFIG identity allocate k8s:app=web/,
      );
      const pid = Number(/\(pid (\d+)\)/.exec(run.stdout)![1]);
      // The printed command, run as the CLI runs it (its default prefix: Cilium's own CRD).
      const out = new Capture();
      const code = await main(
        ["--store", `k8s:${kubeconfig}`, "identity", "allocate", "k8s:app=web", "--json"],
        out.io,
      );
      assert.equal(code, 0, out.stderr);
      assert.ok(JSON.parse(out.stdout).id >= 256, out.stdout);
      run.process.kill("SIGINT");
      const status = await run.done;
      assert.equal(status.code, 0, run.stderr);
      assert.equal(alive(pid), false);
      assert.equal(existsSync(kubeconfig), false, "its files are removed");
    } finally {
      try {
        run.process.kill("SIGKILL");
      } catch {
        // ended
      }
      await run.done;
    }
  },
});
