/**
 * The nemesis interrupted with SIGINT (issue 28, item 12) ends its worker processes and removes
 * its temporary directory, as a clean finished run does, and exits 130.
 */
import assert from "node:assert/strict";
import { ChildOutput } from "../_support/child_output.ts";
import { eventually } from "../_support/eventually.ts";
import { processesWith } from "../_support/processes.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test({
  name: "nemesis interrupted with SIGINT: its workers end, its temporary directory goes, exit 130",
  ignore: Deno.build.os !== "linux",
  fn: async () => {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "nemesis/main.ts", "--backend", "deno-kv", "--seconds", "120"],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const output = new ChildOutput(child, "nemesis");
    let dir: string | undefined;
    try {
      await output.until("\n");
      dir = /logs in (\S+)\n/.exec(output.text)?.[1];
      assert.ok(dir, output.text);
      const root = dir;
      // Its workers run (their configuration names the run's directory).
      await eventually(() => processesWith(root).length >= 4, "the workers run", 60_000);
      child.kill("SIGINT");
      const status = await child.status;
      await output.toEnd();
      const stderr = await output.stderr;
      assert.equal(status.code, 130, stderr);
      assert.match(stderr, /nemesis: SIGINT: stopped its processes, removing /);
      await assert.rejects(Deno.stat(dir), Deno.errors.NotFound, `${dir} was left behind`);
      await eventually(() => processesWith(root).length === 0, "the workers ended", 30_000);
    } finally {
      output.kill();
      for (const pid of dir ? processesWith(dir) : []) Deno.kill(pid, "SIGKILL");
      await child.status;
      await output.toEnd().catch(() => {});
      await output.stderr;
      if (dir) await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});
