/**
 * `watchRemote` leaves nothing behind once closed (issue 28, item 9): the README's identity
 * snippet with a long `AbortSignal.timeout` ends its process as soon as its work is done. It used
 * to stay until the signal fired (5.05 s with a 5 s signal, 12.5 s with 12 s): the remote's abort
 * listener on the caller's signal kept the signal's timer, and so the process, alive.
 */
import assert from "node:assert/strict";
import { ChildOutput } from "../_support/child_output.ts";
import { test } from "../_support/test.ts";
import { runtime } from "../../src/testing/runtime.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
/** The child's signal: it must not decide when the child exits. */
const SIGNAL_MS = 120_000;
/** Far longer than exiting takes, far shorter than the signal. */
const EXIT_MS = 45_000;

// The snippet is the README's Deno one (a Deno KV file); the Node.js and Bun runners list it as
// ignored, as every suite under tests/identity registers through `test()`.
test({
  name: "the README's identity snippet exits once its work is done, not at its signal",
  ignore: runtime !== "deno",
  fn: async () => {
    const child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", "tests/identity/_remote_child.ts", String(SIGNAL_MS)],
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const output = new ChildOutput(child, "identity snippet");
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await output.until("done\n");
      const late = new Promise<"late">((
        resolve,
      ) => (timer = setTimeout(() => resolve("late"), EXIT_MS)));
      const ended = await Promise.race([child.status, late]);
      assert.notEqual(ended, "late", `still running ${EXIT_MS} ms after its work was done`);
      assert.equal((ended as Deno.CommandStatus).code, 0, await output.stderr);
    } finally {
      clearTimeout(timer);
      output.kill();
      await child.status;
      await output.toEnd();
      await output.stderr;
    }
  },
});
