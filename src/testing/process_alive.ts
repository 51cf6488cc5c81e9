/**
 * Whether a process is alive, for the test servers' keepers and their tests: a zombie counts as
 * gone, as it has released its ports. Linux only (reads `/proc`), as the test servers are.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import process from "node:process";
 * import { alive } from "./process_alive.ts";
 *
 * assert.equal(alive(process.pid), true);
 * ```
 *
 * @module
 */
import { readFileSync } from "node:fs";

/** True while process `pid` runs (not a zombie). */
export function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The state follows the parenthesised command name; a zombie has released its ports.
    const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}
