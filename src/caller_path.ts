/**
 * Paths as the user typed them: a relative path names a file in the directory the user ran the
 * command in, under `deno task` too. Used wherever a tool takes a file name from its user (the
 * CLI's `--store` files, the examples' arguments).
 *
 * @example A relative path resolves against `INIT_CWD` when a task runner set it
 * ```ts
 * import assert from "node:assert/strict";
 * import { callerPath } from "./caller_path.ts";
 *
 * assert.equal(callerPath("/var/lib/ids.kv"), "/var/lib/ids.kv");
 * ```
 *
 * @module
 */

/**
 * A relative path against the directory the user ran the command in: `deno task` runs tasks in
 * the directory of deno.json and says where it was started in `INIT_CWD` (npm scripts do the
 * same), so `deno task idalloc --store kv:ids.kv` names a file in the caller's directory, not the
 * repository's. Without `INIT_CWD` (or the env permission to read it) the path stays as given.
 */
export function callerPath(path: string): string {
  if (path.startsWith("/") || /^[A-Za-z]:[\\/]/.test(path)) return path;
  let base: string | undefined;
  let cwd: string | undefined;
  try {
    base = Deno.env.get("INIT_CWD");
    cwd = Deno.cwd();
  } catch {
    // No --allow-env (or --allow-read for the cwd): relative to the working directory, as given.
    return path;
  }
  if (base === undefined || base === "" || base === cwd) return path;
  return `${base.replace(/\/+$/, "")}/${path.replace(/^\.\//, "")}`;
}
