/**
 * The `k8s-memory` bench (`bench/k8s_memory.ts`): its flags, the served shape of its fed
 * identities (what the informer reads back), and one small fed run whose rows carry a positive
 * figure per identity for both layers. No figure's value is asserted: figures live in the bench.
 *
 * @module
 */
import assert from "node:assert/strict";
import { keyOf, MemoryBenchError, parseMemoryArgs, served } from "../../bench/k8s_memory.ts";
import { readIdentity } from "../../src/backends/k8s/layout.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test("k8s-memory flags: taken out of the arguments; defaults 10,000 and 100,000, no real run", () => {
  const args = ["k8s-memory", "--sizes", "2000,5000", "--real", "300"];
  assert.deepEqual(parseMemoryArgs(args), { sizes: [2000, 5000], real: 300 });
  assert.deepEqual(args, ["k8s-memory"]);
  assert.deepEqual(parseMemoryArgs([]), { sizes: [10_000, 100_000] });
  assert.throws(() => parseMemoryArgs(["--sizes", "0"]), MemoryBenchError);
});

Deno.test("k8s-memory: a fed identity reads back as the identity idalloc wrote, with the server's fields", () => {
  const obj = served(7);
  assert.ok(Array.isArray(obj.metadata.managedFields) && obj.metadata.uid);
  const read = readIdentity(obj);
  assert.ok(read.ok);
  assert.deepEqual(
    [read.record.id, read.record.key, read.record.leaseNamespace],
    [1_007, keyOf(7), "idalloc-system"],
  );
});

Deno.test("k8s-memory --sizes 2000: a positive figure per identity for the index and the allocator", async () => {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "bench/main.ts", "k8s-memory", "--sizes", "2000"],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stdout = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0, `${stdout}\n${new TextDecoder().decode(out.stderr).slice(-3000)}`);
  for (const layer of ["index", "allocator"]) {
    const line = stdout.split("\n").find((l) => l.startsWith(`k8s-memory fed, ${layer}, 2,000`));
    assert.ok(line, stdout);
    const bytes = Number(/\(([\d,.]+) B;/.exec(line)?.[1].replaceAll(",", ""));
    assert.ok(bytes > 0, line);
  }
});
