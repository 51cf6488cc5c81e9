/**
 * Which runtime runs this process, how to start a TypeScript file of the repository in a child
 * process on the same runtime (Deno: `deno run -A`; Node.js and Bun: through the hooks in
 * `compat/` that resolve the source's `npm:` specifiers), and where a program is on `PATH`.
 *
 * @example On Deno (the runtime that runs the doc examples)
 * ```ts
 * import assert from "node:assert/strict";
 * import { runtime, scriptCommand } from "./runtime.ts";
 *
 * const [command, args] = scriptCommand("/repo/tests/_support/child_allocate.ts", ["a"]);
 * assert.equal(runtime, "deno");
 * assert.equal(command, Deno.execPath());
 * assert.deepEqual(args, ["run", "-A", "/repo/tests/_support/child_allocate.ts", "a"]);
 * ```
 * @module
 */
import { statSync } from "node:fs";
import process from "node:process";

/** The runtime this process is: `deno`, `bun` or `node`. */
export const runtime: "deno" | "bun" | "node" = "Deno" in globalThis
  ? "deno"
  : "Bun" in globalThis
  ? "bun"
  : "node";

const COMPAT = new URL("../../compat/", import.meta.url);

/** The command and arguments that run the TypeScript file `path` with `args` on this runtime. */
export function scriptCommand(path: string, args: readonly string[]): [string, string[]] {
  switch (runtime) {
    case "deno":
      return [Deno.execPath(), ["run", "-A", path, ...args]];
    case "node":
      return [process.execPath, ["--import", new URL("node.mjs", COMPAT).href, path, ...args]];
    case "bun":
      return [process.execPath, ["--preload", new URL("bun.ts", COMPAT).pathname, path, ...args]];
  }
}

/** Whether `path` is a file (following links). */
export function isFile(path: string): boolean {
  try {
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** The first `binary` on PATH, or `undefined`. */
export function onPath(binary: string): string | undefined {
  for (const dir of (process.env.PATH ?? "").split(":")) {
    if (dir !== "" && isFile(`${dir}/${binary}`)) return `${dir}/${binary}`;
  }
  return undefined;
}
