/**
 * `examples/node/main.ts` runs on whichever runtime runs the tests (Deno, and Node.js and Bun
 * through `tests/_support/runner.ts`): against the shared private etcd, and on a Deno KV file
 * where the runtime can open one (Deno itself; Node.js through `@deno/kv`).
 */
import assert from "node:assert/strict";
import { sharedEtcd } from "../../src/backends/etcd/testing/fixture.ts";
import { etcdUnavailable } from "../../src/backends/etcd/testing/cluster.ts";
import { kvUnavailable } from "../../src/backends/kv/testing/open.ts";
import { runtime } from "../../src/testing/runtime.ts";
import { ScriptProcess } from "../_support/script_process.ts";
import { test } from "../_support/test.ts";

const EXAMPLE = new URL("../../examples/node/main.ts", import.meta.url).pathname;
const ROOT = new URL("../../", import.meta.url).pathname;

async function runExample(args: string[], env: Record<string, string> = {}): Promise<string> {
  await using child = new ScriptProcess(EXAMPLE, [...args, "--count", "100", "--json"], {
    cwd: ROOT,
    env,
  });
  await child.success("examples/node/main.ts");
  const output = child.lines.join("\n");
  assert.doesNotMatch(output, /✘/);
  assert.match(output, /✔ the same ID on both nodes/);
  assert.match(output, /✔ released everything/);
  const rates = JSON.parse(child.lines.at(-1)!) as { runtime: string; rates: object };
  assert.equal(rates.runtime, runtime);
  assert.deepEqual(Object.keys(rates.rates), [
    "new keys",
    "join (2nd node)",
    "cached re-allocation",
  ]);
  return output;
}

test({
  name: `examples/node on ${runtime}: etcd`,
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    const etcd = await sharedEtcd();
    const output = await runExample([], { ETCD_ENDPOINTS: etcd.endpoints.join(",") });
    assert.match(output, new RegExp(`idalloc on ${runtime} .*, etcd at ${etcd.endpoints[0]}`));
  },
});

test({
  name: `examples/node on ${runtime}: a Deno KV file`,
  ignore: kvUnavailable() !== undefined,
  fn: async () => {
    const output = await runExample(["--store", "kv"]);
    assert.match(output, new RegExp(`idalloc on ${runtime} .*, Deno KV file`));
  },
});

test(`examples/node on ${runtime}: a mistake in the arguments is one line and exit code 1`, async () => {
  for (const args of [["--bogus"], ["--store", "redis"], ["--count", "0"]]) {
    await using child = new ScriptProcess(EXAMPLE, args, { cwd: ROOT });
    const { code } = await child.exited;
    assert.equal(code, 1, args.join(" "));
    assert.match(child.stderr, /^node example: .+\nusage: main\.ts /, args.join(" "));
    assert.doesNotMatch(child.stderr, /\bat /, "no stack trace");
  }
});
