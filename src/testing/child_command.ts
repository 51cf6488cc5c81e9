/**
 * Runs a command as a child with extra environment variables and the parent's stdio, passing
 * SIGINT and SIGTERM on to it, and answers its exit code (128 + the signal's number when a signal
 * ended it, as shells report it). Deno only: the test launcher's part.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { runChild } from "./child_command.ts";
 *
 * const code = await runChild(["sh", "-c", 'test "$GREETING" = hi && exit 3'], { GREETING: "hi" });
 * assert.equal(code, 3);
 * ```
 * @module
 */

/** The signals passed on to the child. */
const FORWARDED = ["SIGINT", "SIGTERM"] as const;

const SIGNAL_NUMBERS: Record<string, number> = { SIGHUP: 1, SIGINT: 2, SIGKILL: 9, SIGTERM: 15 };

/**
 * Runs `command` (program and arguments) with `env` added to this process's environment, until
 * it exits; its exit code. SIGINT and SIGTERM sent to this process meanwhile go to the child too
 * (a Ctrl-C reaches both anyway; a `kill` of this process alone must not leave the child behind).
 */
export async function runChild(
  command: readonly string[],
  env: Readonly<Record<string, string>>,
): Promise<number> {
  const [program, ...args] = command;
  if (program === undefined) throw new TypeError("no command to run");
  const child = new Deno.Command(program, {
    args,
    env,
    stdin: "inherit",
    stdout: "inherit",
    stderr: "inherit",
  }).spawn();
  const listeners = FORWARDED.map((signal) => {
    const pass = () => {
      try {
        child.kill(signal);
      } catch {
        // exited meanwhile
      }
    };
    Deno.addSignalListener(signal, pass);
    return () => Deno.removeSignalListener(signal, pass);
  });
  try {
    const status = await child.status;
    if (status.signal !== null) return 128 + (SIGNAL_NUMBERS[status.signal] ?? 0);
    return status.code;
  } finally {
    for (const remove of listeners) remove();
  }
}
