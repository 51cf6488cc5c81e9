/**
 * One rule for relative file paths: the quickstart's `[file]` and the CLI's `--store kv:<file>`
 * both name a file in the caller's directory, also under `deno task` (which runs in the
 * repository), so the CLI sees what the quickstart wrote.
 */
import assert from "node:assert/strict";
import { runCommand, userEnv } from "../_support/commands.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

/** `deno task <args>` of this repository, started in `cwd` as a user's shell would. */
function task(cwd: string, args: string[]) {
  return runCommand(Deno.execPath(), {
    args: ["task", "-q", "--config", `${ROOT}deno.json`, ...args],
    cwd,
    env: userEnv(),
    clearEnv: true,
  });
}

Deno.test("quickstart [file] and --store kv:<file> name the same file in the caller's directory", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-caller-" });
  const name = `caller-${crypto.randomUUID()}.kv`;
  try {
    const quick = await task(dir, ["quickstart", name]);
    assert.equal(quick.code, 0, quick.stderr);
    const web = /app=web; → ID (\d+)/.exec(quick.stdout)?.[1];
    assert.ok(web, quick.stdout);
    assert.ok((await Deno.stat(`${dir}/${name}`)).isFile, "the file is in the caller's directory");
    await assert.rejects(Deno.stat(`${ROOT}${name}`), Deno.errors.NotFound);
    const listed = await task(dir, [
      "idalloc",
      "--store",
      `kv:${name}`,
      "--prefix",
      "quickstart",
      "list",
      "--json",
    ]);
    assert.equal(listed.code, 0, listed.stderr);
    assert.ok(
      JSON.parse(listed.stdout).some((e: { id: number; key: string }) =>
        e.id === Number(web) && e.key === "app=web;"
      ),
      listed.stdout,
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
    await Deno.remove(`${ROOT}${name}`).catch(() => {});
  }
});
