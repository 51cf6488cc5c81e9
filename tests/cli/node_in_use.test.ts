/**
 * Issue 28, item 1: three ordinary commands gave a live holder's ID to another key. With
 * `allocate 'app=held;' --hold --node holder1` running (a process of its own), every command ran
 * as a process of its own too:
 *
 * ```
 * idalloc allocate 'app=x3;' --node holder1        # rc 0: replaced holder1's lease record
 * idalloc gc --grace 0s                             # "deleted ID 41797 app=held;"
 * idalloc allocate 'evil;' --min 41797 --max 41798  # "ID 41797 for evil; (created)"
 * ```
 *
 * Now the first is refused (exit 4, naming the node and until when its lease is live), so the
 * holder keeps its lease, GC keeps its ID and `evil;` gets another one.
 */
import assert from "node:assert/strict";
import { ChildOutput } from "../_support/child_output.ts";
import { testEachBackend } from "../_support/factories.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

function command(args: readonly string[]): Deno.Command {
  return new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "src/cli/main.ts", ...args],
    cwd: ROOT,
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  });
}

/** `idalloc <args>` in a process of its own, to its end. */
async function run(args: readonly string[]): Promise<{ code: number; out: string; err: string }> {
  const { code, stdout, stderr } = await command(args).output();
  const decode = (b: Uint8Array) => new TextDecoder().decode(b);
  return { code, out: decode(stdout), err: decode(stderr) };
}

testEachBackend(
  "allocate under a live holder's node name is refused: GC keeps the holder's ID",
  async (f) => {
    await using fx = await f.create();
    const store = [...fx.spec().cli];
    const child = command([
      ...store,
      "allocate",
      "app=held;",
      "--hold",
      "--node",
      "holder1",
      "--json",
    ]).spawn();
    const holder = new ChildOutput(child, "allocate --hold");
    try {
      await holder.until("\n");
      const held: { id: number } = JSON.parse(holder.text.split("\n")[0]);

      const second = await run([...store, "allocate", "app=x3;", "--node", "holder1"]);
      assert.equal(second.code, 4, `refused, not done:\n${second.out}\n${second.err}`);
      assert.match(second.err, /^idalloc: node holder1 is in use: .* until \d{4}-\d\d-\d\dT\S+ /);
      assert.equal(second.err.trim().split("\n").length, 1, second.err);

      // Whether this GC runs or refuses its grace (the lease protects the holder either way), it
      // does not delete the holder's ID.
      const gc = await run([...store, "gc", "--grace", "0s", "--json"]);
      assert.doesNotMatch(gc.out, new RegExp(`\\b${held.id}\\b`), gc.out);

      const evil = await run([
        ...store,
        "allocate",
        "evil;",
        "--min",
        String(held.id),
        "--max",
        String(held.id + 1),
        "--json",
      ]);
      assert.equal(evil.code, 0, evil.err);
      assert.notEqual(JSON.parse(evil.out).id, held.id, "the held ID went to another key");
      const get = await run([...store, "get", "app=held;"]);
      assert.equal(get.out.trim(), String(held.id));
    } finally {
      // Ctrl-C: the holder releases its key and exits.
      try {
        child.kill("SIGINT");
      } catch {
        // already exited
      }
      await holder.toEnd();
      await holder.stderr;
      await child.status;
    }
  },
);
