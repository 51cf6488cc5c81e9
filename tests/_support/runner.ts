/**
 * Runs test files registered through `tests/_support/test.ts` on Node.js or Bun, one test at a
 * time, and exits non-zero if any fails. Arguments are test files or directories (every
 * `*.test.ts` below them); `--filter <text>` keeps tests whose name contains it.
 *
 * ```sh
 * node --import ./compat/node.mjs tests/_support/runner.ts tests/conformance tests/identity
 * bun --preload ./compat/bun.ts tests/_support/runner.ts tests/conformance tests/identity
 * ```
 *
 * @module
 */
import { readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import process from "node:process";
import { pathToFileURL } from "node:url";
import { runtime } from "../../src/testing/runtime.ts";
import { collectedTests } from "./test.ts";

/** A test that takes longer than this fails (Deno's runner has no limit; CI's clock does). */
const TEST_TIMEOUT_MS = 180_000;

function testFiles(path: string): string[] {
  if (!statSync(path).isDirectory()) return [resolve(path)];
  return readdirSync(path).sort().flatMap((name) => {
    const full = join(path, name);
    if (statSync(full).isDirectory()) return testFiles(full);
    return name.endsWith(".test.ts") ? [resolve(full)] : [];
  });
}

function withTimeout(body: Promise<void>, ms: number): Promise<void> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([body, timeout]).finally(() => clearTimeout(timer));
}

const args = process.argv.slice(2);
const filterAt = args.indexOf("--filter");
const filter = filterAt >= 0 ? args.splice(filterAt, 2)[1] : undefined;
if (runtime === "deno") {
  console.error("runner: under Deno, use `deno test`");
  process.exit(2);
}
if (args.length === 0) {
  console.error("runner: give test files or directories");
  process.exit(2);
}

const files = args.flatMap(testFiles);
for (const file of files) await import(pathToFileURL(file).href);

const started = performance.now();
const counts = { passed: 0, failed: 0, ignored: 0, filtered: 0 };
const failures: string[] = [];
console.log(`running ${collectedTests().length} tests from ${files.length} files (${runtime})`);
for (const t of collectedTests()) {
  if (filter !== undefined && !t.name.includes(filter)) {
    counts.filtered++;
    continue;
  }
  if (t.ignore) {
    counts.ignored++;
    console.log(`${t.name} ... ignored`);
    continue;
  }
  const t0 = performance.now();
  try {
    await withTimeout(Promise.resolve().then(() => t.fn()), TEST_TIMEOUT_MS);
    counts.passed++;
    console.log(`${t.name} ... ok (${Math.round(performance.now() - t0)}ms)`);
  } catch (err) {
    counts.failed++;
    failures.push(t.name);
    console.log(`${t.name} ... FAILED (${Math.round(performance.now() - t0)}ms)`);
    console.log(err instanceof Error ? err.stack ?? String(err) : String(err));
  }
}
const seconds = ((performance.now() - started) / 1000).toFixed(1);
console.log(
  `\n${counts.failed ? "FAILED" : "ok"} | ${counts.passed} passed | ${counts.failed} failed | ` +
    `${counts.ignored} ignored | ${counts.filtered} filtered out (${seconds}s, ${runtime})`,
);
for (const name of failures) console.log(`  failed: ${name}`);
// Exit rather than wait: a leaked handle must not hang CI (Deno's sanitizers catch leaks).
process.exit(counts.failed ? 1 : 0);
