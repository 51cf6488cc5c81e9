/**
 * The nemesis interrupted with SIGINT removes its temporary directory, as a clean finished run does
 * (issue 28, item 12), and exits 130.
 */
import assert from "node:assert/strict";
import { ChildOutput } from "../_support/child_output.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test("nemesis interrupted with SIGINT: its temporary directory is removed, exit 130", async () => {
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
    assert.ok((await Deno.stat(dir)).isDirectory);
    child.kill("SIGINT");
    const status = await child.status;
    await output.toEnd();
    const stderr = await output.stderr;
    assert.equal(status.code, 130, stderr);
    assert.match(stderr, /nemesis: SIGINT: removing /);
    await assert.rejects(Deno.stat(dir), Deno.errors.NotFound, `${dir} was left behind`);
  } finally {
    output.kill();
    await child.status;
    await output.toEnd().catch(() => {});
    await output.stderr;
    if (dir) await Deno.remove(dir, { recursive: true }).catch(() => {});
  }
});
