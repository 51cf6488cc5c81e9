/**
 * Node.js and Bun outside the checkout (`docs/node-and-bun.md`, "From a project folder of your
 * own"): an application in a temp dir with its own `package.json` imports the library by the
 * package's names (`@idalloc/idalloc`, `@idalloc/idalloc/etcd`) and runs with the checkout's hook
 * (`node --import <checkout>/compat/node.mjs`, `bun --preload <checkout>/compat/bun.ts`), against
 * a real etcd. And a Node.js below 24 is told so in one line, by the hook and by
 * `deno task test:node`, instead of a raw `ERR_UNKNOWN_FILE_EXTENSION` stack trace.
 *
 * Runs under Deno (with `node` ≥ 24 and `bun` from `PATH`, or ignored saying why) and on Node.js
 * and Bun themselves (`deno task test:node`, `test:bun`).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import process from "node:process";
import { etcdUnavailable } from "../../src/backends/etcd/testing/cluster.ts";
import { sharedEtcd } from "../../src/backends/etcd/testing/fixture.ts";
import { runtime } from "../../src/testing/runtime.ts";
import { test } from "../_support/test.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

interface Run {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

function run(
  command: string,
  args: readonly string[],
  options: { cwd?: string; env?: Record<string, string> } = {},
): Promise<Run> {
  return new Promise((resolve) => {
    execFile(
      command,
      args,
      { cwd: options.cwd, env: { ...process.env, ...options.env }, timeout: 120_000 },
      (err, stdout, stderr) => {
        const code = err === null ? 0 : typeof err.code === "number" ? err.code : 1;
        resolve({ code, stdout: String(stdout), stderr: String(stderr) });
      },
    );
  });
}

/** The first `name` on `PATH`. */
function onPath(name: string): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir !== "" && existsSync(join(dir, name))) return join(dir, name);
  }
  return undefined;
}

/** The major version of the Node.js at `path`. */
async function nodeMajor(path: string): Promise<number> {
  const { stdout } = await run(path, ["--version"]);
  return Number(/^v(\d+)/.exec(stdout.trim())?.[1] ?? 0);
}

/** The runtime's binary: this process's when it is that runtime, else the one on `PATH`. */
async function binary(name: "node" | "bun"): Promise<{ path?: string; why?: string }> {
  const path = runtime === name ? process.execPath : onPath(name);
  if (path === undefined) return { why: `no ${name} on PATH` };
  if (name === "node" && (await nodeMajor(path)) < 24) return { why: "node on PATH is below 24" };
  return { path };
}

const NODE = await binary("node");
const BUN = await binary("bun");

/** An application of the user's own: a folder with its package.json and main.js. */
async function userProject(prefix: string): Promise<{ dir: string } & AsyncDisposable> {
  const dir = await mkdtemp(join(tmpdir(), "idalloc-user-app-"));
  await writeFile(
    join(dir, "package.json"),
    JSON.stringify({ name: "my-app", private: true, type: "module" }, null, 2),
  );
  await writeFile(
    join(dir, "main.js"),
    `import { Allocator } from "@idalloc/idalloc";
import { EtcdBackend } from "@idalloc/idalloc/etcd";

const endpoints = process.env.ETCD_ENDPOINTS.split(",");
const backend = await EtcdBackend.connect({ endpoints, prefix: ${
      JSON.stringify(prefix)
    }, node: "app" });
await using allocator = await Allocator.open(backend, { max: 65535 });
const { id } = await allocator.allocate("app=web;");
console.log(JSON.stringify({ id, again: (await allocator.allocate("app=web;")).id }));
`,
  );
  return { dir, [Symbol.asyncDispose]: () => rm(dir, { recursive: true, force: true }) };
}

for (
  const [name, found, hook] of [
    ["node", NODE, ["--import", `${ROOT}compat/node.mjs`]],
    ["bun", BUN, ["--preload", `${ROOT}compat/bun.ts`]],
  ] as const
) {
  const why = found.why ?? etcdUnavailable();
  test({
    name: `${name} in a project folder of its own imports @idalloc/idalloc by name${
      why === undefined ? "" : ` (unavailable here: ${why})`
    }`,
    ignore: why !== undefined,
    fn: async () => {
      const etcd = await sharedEtcd();
      await using project = await userProject(`outside-${name}-${crypto.randomUUID()}`);
      const result = await run(found.path!, [...hook, "main.js"], {
        cwd: project.dir,
        env: { ETCD_ENDPOINTS: etcd.endpoints.join(",") },
      });
      assert.equal(result.code, 0, result.stderr);
      const { id, again } = JSON.parse(result.stdout);
      assert.ok(id >= 1 && id === again, result.stdout);
      assert.equal(result.stderr, "");
    },
  });
}

const OLD_NODE = onPath("node");
const oldMajor = OLD_NODE === undefined ? undefined : await nodeMajor(OLD_NODE);
const oldWhy = runtime !== "deno"
  ? "runs under Deno"
  : oldMajor === undefined
  ? "no node on PATH"
  : oldMajor >= 24
  ? `node on PATH is ${oldMajor}, not an old one`
  : undefined;

test({
  name: `a Node.js below 24 is told so in one line, by the hook and by deno task test:node${
    oldWhy === undefined ? "" : ` (unavailable here: ${oldWhy})`
  }`,
  ignore: oldWhy !== undefined,
  fn: async () => {
    const line = new RegExp(
      `^idalloc needs Node\\.js 24 or later; this is Node\\.js v${oldMajor}\\.\\S+ \\(.+\\)\\n$`,
    );
    const hook = await run(OLD_NODE!, ["--import", "./compat/node.mjs", "-e", "0"], { cwd: ROOT });
    assert.equal(hook.code, 1);
    assert.match(hook.stderr, line);
    const task = await run(Deno.execPath(), ["task", "-q", "test:node"], { cwd: ROOT });
    assert.equal(task.code, 1);
    // The task runs under the test launcher, whose own lines say which servers it started and
    // what the run left on them; what Node.js said is the one other line.
    const said = task.stderr.split("\n").filter((l) => !l.startsWith("launcher: ")).join("\n");
    assert.match(said, line);
    assert.doesNotMatch(task.stderr, /ERR_UNKNOWN_FILE_EXTENSION/);
  },
});
