/**
 * `deno task bench runtimes`: the Node.js example (`examples/node/main.ts`, the quickstart of the
 * `docs/node-and-bun.md`) on Deno, Node.js and Bun side by side: new keys, joins by a
 * second node and cached re-allocations, sequential, on a fresh store of every backend whose
 * harness says how the example runs on it (`BenchHooks.example`: a private etcd; a Deno KV file
 * where the runtime can open one — Deno, and Node.js through `@deno/kv`). Each cell is a fresh
 * process, the runtimes take turns, medians of `--runs`.
 *
 * Node.js and Bun are taken from `IDALLOC_NODE` / `IDALLOC_BUN`, else from `PATH` (`npm install
 * node@24 bun` puts both in `node_modules/.bin`); a runtime that is missing is skipped with a note.
 *
 * @module
 */
import { execFile } from "node:child_process";
import process from "node:process";
import { loadHarnesses } from "../src/testing/harness.ts";
import { onPath } from "../src/testing/runtime.ts";
import { type BenchRow, rateSpread } from "./_table.ts";

const EXAMPLE = new URL("../examples/node/main.ts", import.meta.url).pathname;
const ROOT = new URL("../", import.meta.url).pathname;
const COMPAT = new URL("../compat/", import.meta.url).pathname;
/** Keys per run: enough for a steady rate, few enough for three runtimes × runs. */
const KEYS = 2_000;

interface Runtime {
  readonly name: "deno" | "node" | "bun";
  /** The command line that runs the example with `args`. */
  readonly command: (args: string[]) => [string, string[]];
}

function runtimes(): { found: Runtime[]; missing: string[] } {
  const node = process.env.IDALLOC_NODE ?? onPath("node");
  const bun = process.env.IDALLOC_BUN ?? onPath("bun");
  const found: Runtime[] = [{
    name: "deno",
    command: (args) => [Deno.execPath(), ["run", "-A", EXAMPLE, ...args]],
  }];
  const missing: string[] = [];
  if (node) {
    found.push({
      name: "node",
      command: (args) => [node, ["--import", `${COMPAT}node.ts`, EXAMPLE, ...args]],
    });
  } else missing.push("node (set IDALLOC_NODE or put node ≥ 24 on PATH)");
  if (bun) {
    found.push({
      name: "bun",
      command: (args) => [bun, ["--preload", `${COMPAT}bun.ts`, EXAMPLE, ...args]],
    });
  } else missing.push("bun (set IDALLOC_BUN or put bun on PATH)");
  return { found, missing };
}

/** One run of the example: its rates and the runtime's version line. */
async function runOnce(
  rt: Runtime,
  args: readonly string[],
  env: Readonly<Record<string, string>>,
): Promise<{ version: string; rates: Record<string, number> }> {
  const [command, argv] = rt.command([...args, "--count", String(KEYS), "--json"]);
  const stdout = await new Promise<string>((resolve, reject) => {
    execFile(command, argv, { cwd: ROOT, env: { ...process.env, ...env } }, (err, out, errOut) => {
      if (err) reject(new Error(`${rt.name} example failed: ${errOut || err.message}`));
      else resolve(out);
    });
  });
  const lines = stdout.trim().split("\n");
  const version = /^idalloc on (\S+ \S+),/.exec(lines[0])?.[1] ?? rt.name;
  return { version: version.replace(/,$/, ""), rates: JSON.parse(lines.at(-1)!).rates };
}

/** The table rows (see the module doc). */
export async function benchRuntimes(runs: number): Promise<BenchRow[]> {
  const { found, missing } = runtimes();
  const rows: BenchRow[] = missing.map((m) => ({ name: "runtimes", value: `skipped: ${m}` }));
  for (const harness of await loadHarnesses()) {
    const example = harness.bench.example;
    if (example === undefined) continue;
    const name = harness.kind;
    const why = harness.unavailable();
    if (why !== undefined) {
      rows.push({ name: `runtimes ${name}`, value: `skipped: ${why}` });
      continue;
    }
    await using store = await example.start();
    const cells = found.filter((rt) => example.unsupported?.[rt.name] === undefined);
    const results = new Map<string, { version: string; rates: Record<string, number> }[]>();
    for (let run = 0; run < runs; run++) {
      for (const rt of cells) {
        console.error(`  runtimes: ${name} on ${rt.name}, run ${run + 1}/${runs}`);
        const list = results.get(rt.name) ?? [];
        list.push(await runOnce(rt, store.args, store.env));
        results.set(rt.name, list);
      }
    }
    for (const rt of cells) {
      const list = results.get(rt.name)!;
      for (const what of Object.keys(list[0].rates)) {
        const xs = list.map((r) => r.rates[what]);
        rows.push({ name: `runtimes ${name} ${list[0].version}, ${what}`, value: rateSpread(xs) });
      }
    }
    for (const rt of found) {
      const unsupported = example.unsupported?.[rt.name];
      if (unsupported) {
        rows.push({ name: `runtimes ${name} on ${rt.name}`, value: `skipped: ${unsupported}` });
      }
    }
  }
  return rows;
}
