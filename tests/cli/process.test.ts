/**
 * The CLI as a process: `deno task idalloc` works, and Ctrl-C (SIGINT) ends `watch` cleanly with
 * exit code 0 after everything it printed.
 */
import assert from "node:assert/strict";
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
  const stderr = new Response(child.stderr).text();
  const reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  try {
    while (!out.includes('"synced"')) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`watch exited early: ${await stderr}`);
      out += value;
    }
    await cli([...store.args, "allocate", "app=db;"]);
    while (!out.includes("app=db;")) {
      const { value, done } = await reader.read();
      if (done) throw new Error(`watch exited early: ${await stderr}`);
      out += value;
    }
    child.kill("SIGINT");
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      out += value;
    }
  } finally {
    try {
      child.kill("SIGKILL");
    } catch {
      // already exited
    }
  }
  const status = await child.status;
  assert.equal(status.code, 0, await stderr);
  assert.equal(await stderr, "");
  const lines = out.trim().split("\n").map((l) => JSON.parse(l));
  assert.deepEqual(lines[0], { type: "upsert", id: web.id, key: "app=web;" });
  assert.deepEqual(lines[1], { type: "synced" });
  assert.equal(lines[2].key, "app=db;");
  assert.equal(lines.length, 3);
});
