/**
 * The CLI as a process: `deno task idalloc` works, and Ctrl-C (SIGINT) ends `watch` cleanly with
 * exit code 0 after everything it printed.
 */
import assert from "node:assert/strict";
import { ChildOutput } from "../_support/child_output.ts";
import { cli, TempStore } from "./_run.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test("deno task idalloc runs the CLI", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["task", "-q", "idalloc", "--help"],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  assert.match(new TextDecoder().decode(out.stdout), /Usage: idalloc/);
});

Deno.test("SIGINT ends watch with exit code 0; a second process sees the same store", async () => {
  await using store = await TempStore.create();
  const allocated = await cli([...store.args, "allocate", "app=web;", "--json"]);
  assert.equal(allocated.code, 0, allocated.stderr);
  const web = JSON.parse(allocated.stdout);
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "src/cli/main.ts", ...store.args, "watch"],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const output = new ChildOutput(child, "watch");
  try {
    await output.until('"synced"');
    await cli([...store.args, "allocate", "app=db;"]);
    await output.until("app=db;");
    child.kill("SIGINT");
    await output.toEnd();
  } finally {
    output.kill();
  }
  const status = await child.status;
  assert.equal(status.code, 0, await output.stderr);
  assert.equal(await output.stderr, "");
  const lines = output.text.trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(lines[0], { type: "upsert", id: web.id, key: "app=web;" });
  assert.deepEqual(lines[1], { type: "synced" });
  assert.equal(lines[2].key, "app=db;");
  assert.equal(lines.length, 3);
});
