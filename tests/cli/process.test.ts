/**
 * The CLI as a process: `deno task idalloc` works, and Ctrl-C (SIGINT) ends `watch` cleanly with
 * exit code 0 after everything it printed — also when the Ctrl-C reaches the whole process group
 * of `deno task` (which forwards it to the CLI a second time).
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

/** `deno task -q idalloc …` in a process group of its own, as a terminal runs it. */
function taskInGroup(args: string[]): { child: Deno.ChildProcess; output: ChildOutput } {
  const child = new Deno.Command("setsid", {
    args: [Deno.execPath(), "task", "-q", "idalloc", ...args],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  return { child, output: new ChildOutput(child, `idalloc ${args.join(" ")}`) };
}

/** Ctrl-C on a terminal: SIGINT to every process of the group (deno task and the CLI). */
function ctrlC(child: Deno.ChildProcess): void {
  // `setsid` made the child a group leader: its PID is the group's ID.
  Deno.kill(-child.pid, "SIGINT");
}

function killGroup(child: Deno.ChildProcess): void {
  try {
    Deno.kill(-child.pid, "SIGKILL");
  } catch {
    // already gone
  }
}

Deno.test({
  name: "Ctrl-C to deno task's process group releases a held key and exits 0",
  ignore: Deno.build.os === "windows",
  fn: async () => {
    await using store = await TempStore.create();
    for (let run = 1; run <= 3; run++) {
      // A name per run: a run's lease outlives it (a live name is refused to the next run).
      const node = `holder${run}`;
      const { child, output } = taskInGroup([
        ...store.args,
        "--node",
        node,
        "allocate",
        "hk;",
        "--hold",
        "--json",
      ]);
      try {
        await output.until("\n");
        ctrlC(child);
        await output.toEnd();
      } finally {
        killGroup(child);
      }
      const status = await child.status;
      assert.equal(status.code, 0, `run ${run}: ${await output.stderr}`);
      const [held, released] = output.text.trim().split("\n").map((l) => JSON.parse(l));
      assert.equal(held.key, "hk;");
      assert.deepEqual(released, { key: "hk;", id: held.id, released: true, node });
      const refs = await cli([...store.args, "refs", "hk;", "--json"]);
      assert.deepEqual(JSON.parse(refs.stdout), [], `run ${run}: the reference was released`);
    }
  },
});

Deno.test({
  name: "Ctrl-C to deno task's process group ends watch with exit 0",
  ignore: Deno.build.os === "windows",
  fn: async () => {
    await using store = await TempStore.create();
    await cli([...store.args, "allocate", "app=web;"]);
    const { child, output } = taskInGroup([...store.args, "watch"]);
    try {
      await output.until('"synced"');
      ctrlC(child);
      await output.toEnd();
    } finally {
      killGroup(child);
    }
    assert.equal((await child.status).code, 0, await output.stderr);
    assert.equal(await output.stderr, "");
  },
});

Deno.test("a key that is not UTF-8 on the command line is refused, not merged", async () => {
  await using store = await TempStore.create();
  // The shell passes raw bytes: 0xC3 alone is not UTF-8.
  const out = await new Deno.Command("bash", {
    args: [
      "-c",
      `exec "$0" task -q idalloc ${store.args.join(" ")} allocate $'bad\\xc3'`,
      Deno.execPath(),
    ],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.equal(out.code, 1, stderr);
  assert.match(stderr, /is not valid UTF-8 text/);
  assert.equal(out.stdout.length, 0);
});
