/**
 * Runs test files registered through `tests/_support/test.ts` on Node.js or Bun and exits non-zero
 * if any fails. Arguments are test files or directories (every `*.test.ts` below them);
 * `--filter <text>` keeps tests whose name contains it; `--jobs <n>` (default 3) runs that many
 * files at once, each in a child process of the same runtime and flags, as `deno test --parallel`
 * runs modules side by side. Within a file, tests run one at a time.
 *
 * ```sh
 * node --import ./compat/node.mjs tests/_support/runner.ts tests/conformance tests/identity
 * bun --preload ./compat/bun.ts tests/_support/runner.ts --jobs 1 tests/conformance
 * ```
 *
 * @module
 */
import { spawn } from "node:child_process";
import { readdirSync, statSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import process from "node:process";
import { fileURLToPath, pathToFileURL } from "node:url";
import { runtime } from "../../src/testing/runtime.ts";
import { collectedTests } from "./test.ts";

/** A test that takes longer than this fails (Deno's runner has no limit; CI's clock does). */
const TEST_TIMEOUT_MS = 180_000;

/**
 * Files run at once by default. Most of the suite's time is spent waiting on leases, stalls and
 * servers (one file at a time kept the CPU under half busy on 2 cores), and every file attaches to
 * the launcher's shared servers, so more files at once add no servers.
 */
const DEFAULT_JOBS = 3;

/** What one run counted; a child prints it as its last line for the parent to add up. */
interface Counts {
  passed: number;
  failed: number;
  ignored: number;
  filtered: number;
  /** The failed tests' names (with their file's when run in a child). */
  failures: string[];
}

function noCounts(): Counts {
  return { passed: 0, failed: 0, ignored: 0, filtered: 0, failures: [] };
}

const COUNTS_TAG = "runner-counts ";
/** Marks a child run by the parent: one file, counts printed for the parent. */
const CHILD_FLAG = "--child";

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

/** Takes `--name <value>` out of `args`. */
function option(args: string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 ? args.splice(at, 2)[1] : undefined;
}

/** Runs the files' tests in this process, one at a time. */
async function runHere(files: string[], filter: string | undefined): Promise<Counts> {
  for (const file of files) await import(pathToFileURL(file).href);
  const counts = noCounts();
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
      counts.failures.push(t.name);
      console.log(`${t.name} ... FAILED (${Math.round(performance.now() - t0)}ms)`);
      console.log(err instanceof Error ? err.stack ?? String(err) : String(err));
    }
  }
  return counts;
}

/**
 * Runs one file in a child of the same runtime with the same flags (`--import`/`--preload`), and
 * prints its output in one piece when it ends, so that files running side by side do not
 * interleave. A child that dies without its counts counts as one failure.
 */
function runChild(file: string, filter: string | undefined): Promise<Counts> {
  const self = fileURLToPath(import.meta.url);
  const args = [...process.execArgv, self, CHILD_FLAG, file];
  if (filter !== undefined) args.push("--filter", filter);
  return new Promise((done) => {
    const child = spawn(process.execPath, args, { stdio: ["ignore", "pipe", "pipe"] });
    let output = "";
    child.stdout.on("data", (chunk) => output += chunk);
    child.stderr.on("data", (chunk) => output += chunk);
    child.on("close", (code, signal) => {
      const tagged = output.split("\n").findLast((line) => line.startsWith(COUNTS_TAG));
      const shown = output.split("\n").filter((line) => !line.startsWith(COUNTS_TAG)).join("\n");
      const name = relative(process.cwd(), file);
      console.log(`--- ${name}\n${shown.trimEnd()}`);
      if (tagged !== undefined) {
        const counts: Counts = JSON.parse(tagged.slice(COUNTS_TAG.length));
        counts.failures = counts.failures.map((test) => `${name}: ${test}`);
        return done(counts);
      }
      const end = signal ?? `exit ${code}`;
      console.log(`FAILED: ${name}'s process ended (${end}) without its counts`);
      done({ ...noCounts(), failed: 1, failures: [`${name}: its process (${end})`] });
    });
  });
}

/** Runs every file in a child, `jobs` at a time, and adds up their counts. */
async function runInChildren(
  files: string[],
  filter: string | undefined,
  jobs: number,
): Promise<Counts> {
  const total = noCounts();
  const queue = [...files];
  const worker = async () => {
    for (let file = queue.shift(); file !== undefined; file = queue.shift()) {
      const counts = await runChild(file, filter);
      total.passed += counts.passed;
      total.failed += counts.failed;
      total.ignored += counts.ignored;
      total.filtered += counts.filtered;
      total.failures.push(...counts.failures);
    }
  };
  await Promise.all(Array.from({ length: Math.min(jobs, files.length) }, worker));
  return total;
}

const args = process.argv.slice(2);
const childAt = args.indexOf(CHILD_FLAG);
const child = childAt >= 0;
if (child) args.splice(childAt, 1);
const filter = option(args, "--filter");
const jobsText = option(args, "--jobs") ?? process.env.IDALLOC_TEST_JOBS ?? String(DEFAULT_JOBS);
const jobs = Number(jobsText);
if (runtime === "deno") {
  console.error("runner: under Deno, use `deno test`");
  process.exit(2);
}
if (!Number.isInteger(jobs) || jobs < 1) {
  console.error(`runner: --jobs takes a whole number of at least 1, not ${jobsText}`);
  process.exit(2);
}
if (args.length === 0) {
  console.error("runner: give test files or directories");
  process.exit(2);
}

const files = args.flatMap(testFiles);
const started = performance.now();
if (!child) console.log(`running ${files.length} files, ${jobs} at a time (${runtime})`);
const counts = jobs > 1 && !child
  ? await runInChildren(files, filter, jobs)
  : await runHere(files, filter);
if (child) {
  console.log(COUNTS_TAG + JSON.stringify(counts));
} else {
  const seconds = ((performance.now() - started) / 1000).toFixed(1);
  console.log(
    `\n${counts.failed ? "FAILED" : "ok"} | ${counts.passed} passed | ${counts.failed} failed | ` +
      `${counts.ignored} ignored | ${counts.filtered} filtered out (${seconds}s, ${runtime})`,
  );
  for (const name of counts.failures) console.log(`  failed: ${name}`);
}
// Exit rather than wait: a leaked handle must not hang CI (Deno's sanitizers catch leaks).
process.exit(counts.failed ? 1 : 0);
