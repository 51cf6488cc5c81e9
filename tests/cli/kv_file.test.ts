/**
 * Deno KV paths that are not a usable store file (issue 28, items 5 and 6), through the driver
 * (what the library reports) and the CLI in a process of its own:
 * - a named pipe is refused before it is opened (exit 1): opening one hung past `timeout 10`,
 *   deaf to SIGTERM;
 * - a file this user may not read (another user's, mode 600) and `/proc/self/mem` (EIO) are
 *   `StoreUnavailableError`s naming the path and the cause in words (exit 2), not "internal error,
 *   a bug" (exit 5).
 */
import assert from "node:assert/strict";
import { InvalidOptionsError, StoreUnavailableError } from "../../src/errors.ts";
import { kvDriver } from "../../src/backends/kv/driver.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
/** Far beyond what a refusal takes: only a hang reaches it. */
const HANG_MS = 30_000;

/** The driver's `open` of `path`, as the CLI calls it for `list`. */
function openKvPath(path: string) {
  return kvDriver.open({ path, prefix: ["idalloc"], pollIntervalMs: 1000, maxClockSkewMs: 5000 }, {
    node: "n",
    create: false,
    signal: AbortSignal.timeout(HANG_MS),
  });
}

/** `idalloc --store kv:<path> list` in a process of its own (as `user`, when given). */
async function list(
  path: string,
  user?: { uid: number; gid: number; home: string },
): Promise<{ code: number; stderr: string }> {
  const args = ["run", "-A", "src/cli/main.ts", "--store", `kv:${path}`, "list"];
  const command = user
    ? new Deno.Command("setpriv", {
      // Its own DENO_DIR (root's is not the user's to read): the modules are all in the
      // repository's node_modules and Deno's cache is not needed.
      args: [
        `--reuid=${user.uid}`,
        `--regid=${user.gid}`,
        "--clear-groups",
        Deno.execPath(),
        ...args.slice(0, 2),
        "--cached-only",
        ...args.slice(2),
      ],
      env: { HOME: user.home, DENO_DIR: user.home },
      cwd: ROOT,
      stdout: "null",
      stderr: "piped",
      signal: AbortSignal.timeout(HANG_MS),
    })
    : new Deno.Command(Deno.execPath(), {
      args,
      cwd: ROOT,
      stdout: "null",
      stderr: "piped",
      signal: AbortSignal.timeout(HANG_MS),
    });
  const out = await command.output();
  const stderr = new TextDecoder().decode(out.stderr);
  assert.notEqual(out.signal, "SIGTERM", `killed after ${HANG_MS} ms (a hang): ${stderr}`);
  return { code: out.code, stderr };
}

function commandWorks(name: string, args: string[]): boolean {
  try {
    return new Deno.Command(name, { args, stdout: "null", stderr: "null" }).outputSync().success;
  } catch {
    return false;
  }
}

Deno.test({
  name: "kv: a named pipe as the store is refused before it is opened (exit 1)",
  ignore: !commandWorks("mkfifo", ["--version"]),
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "idalloc-fifo-" });
    try {
      const fifo = `${dir}/ids.kv`;
      assert.ok(commandWorks("mkfifo", [fifo]));
      await assert.rejects(
        openKvPath(fifo),
        (err) =>
          err instanceof InvalidOptionsError &&
          err.message.includes(`kv:${fifo} is a named pipe (FIFO), not a file`),
      );
      const { code, stderr } = await list(fifo);
      assert.equal(code, 1, stderr);
      assert.match(stderr, /^idalloc: invalid option: --store kv:\S+ is a named pipe \(FIFO\)/);
      assert.equal(stderr.trim().split("\n").length, 1, stderr);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});

Deno.test("kv: /proc/self/mem (EIO) is an unavailable store, in words (exit 2)", async () => {
  await assert.rejects(openKvPath("/proc/self/mem"), (err) => {
    assert.ok(err instanceof StoreUnavailableError, String(err));
    assert.match(err.message, /^cannot read Deno KV store \/proc\/self\/mem: input\/output error/);
    assert.ok(err.cause !== undefined);
    return true;
  });
  const { code, stderr } = await list("/proc/self/mem");
  assert.equal(code, 2, stderr);
  assert.match(
    stderr,
    /^idalloc: store unavailable: cannot read Deno KV store \/proc\/self\/mem: input\/output error/,
  );
  assert.doesNotMatch(stderr, /internal error/);
});

const root = Deno.uid() === 0 && commandWorks("setpriv", ["--version"]);

Deno.test({
  name: "kv: another user's mode-600 file is an unavailable store, in words (exit 2)",
  // Only root can make a file another user cannot read, and run the CLI as that user.
  ignore: !root,
  fn: async () => {
    const dir = await Deno.makeTempDir({ prefix: "idalloc-unreadable-" });
    const home = await Deno.makeTempDir({ prefix: "idalloc-nobody-" });
    try {
      await Deno.chmod(dir, 0o755);
      const id = (flag: string) =>
        Number(
          new TextDecoder().decode(
            new Deno.Command("id", { args: [flag, "nobody"] }).outputSync().stdout,
          ),
        );
      const nobody = { uid: id("-u"), gid: id("-g"), home };
      await Deno.chown(home, nobody.uid, nobody.gid);
      // root's, mode 600: the file of another user, for nobody.
      const file = `${dir}/ids.kv`;
      await Deno.writeTextFile(file, "");
      await Deno.chmod(file, 0o600);
      const { code, stderr } = await list(file, nobody);
      assert.equal(code, 2, stderr);
      assert.match(
        stderr,
        new RegExp(
          `^idalloc: store unavailable: cannot read Deno KV store ${file}: permission denied`,
        ),
      );
      assert.match(stderr, /check its owner and mode/);
      assert.doesNotMatch(stderr, /internal error/);
    } finally {
      await Deno.remove(dir, { recursive: true });
      await Deno.remove(home, { recursive: true });
    }
  },
});
