/**
 * Waiting in tests for something another node, process or timer makes true, without asserting on
 * how long it takes.
 *
 * @example
 * ```ts
 * let replaced = 0;
 * setTimeout(() => replaced++, 50);
 * await eventually(() => replaced === 1, "the timer fired");
 * ```
 * @module
 */
import assert from "node:assert/strict";

/** Polls `check` every 20 ms until it holds, failing with `message` after `timeoutMs`. */
export async function eventually(
  check: () => boolean | Promise<boolean>,
  message: string,
  timeoutMs = 15_000,
): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) assert.fail(`timed out waiting until ${message}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}
