/**
 * The library used from a Deno project of the user's own, configured as the README says, prints
 * no "Ignored build scripts … npm:protobufjs" box (etcd3's protobufjs has a postinstall script
 * that idalloc does not need; only the project's `allowScripts.deny` keeps Deno from warning about
 * it). The installed CLI's case is in tests/examples/readme.test.ts.
 */
import assert from "node:assert/strict";
import { etcdUnavailable } from "../../src/backends/etcd/testing/cluster.ts";
import { sharedEtcd } from "../../src/backends/etcd/testing/fixture.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

const BOX = /Ignored build scripts/;

async function run(
  command: string,
  args: readonly string[],
  options: { cwd: string; env?: Record<string, string> },
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(command, { args: [...args], ...options }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

Deno.test({
  name:
    "a Deno project using the etcd backend, configured as the README says, runs without the box",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    const readme = await Deno.readTextFile(`${ROOT}README.md`);
    const config = /```json\n(\{\s*"allowScripts"[\s\S]*?\})\n```/.exec(readme)?.[1];
    assert.ok(config, "the README shows the deno.json that keeps the box away");
    const etcd = await sharedEtcd();
    const dir = await Deno.makeTempDir({ prefix: "idalloc-deno-app-" });
    try {
      await Deno.writeTextFile(`${dir}/deno.json`, config);
      await Deno.writeTextFile(
        `${dir}/main.ts`,
        `import { Allocator } from ${JSON.stringify(`${ROOT}mod.ts`)};
import { EtcdBackend } from ${JSON.stringify(`${ROOT}src/backends/etcd/mod.ts`)};
const backend = await EtcdBackend.connect({
  endpoints: ${JSON.stringify(etcd.endpoints)},
  prefix: "deno-app-${crypto.randomUUID()}",
  node: "app",
});
await using allocator = await Allocator.open(backend, { max: 65535 });
console.log((await allocator.allocate("app=web;")).id);
`,
      );
      const result = await run(Deno.execPath(), ["run", "-A", "main.ts"], { cwd: dir });
      assert.equal(result.code, 0, result.stderr);
      assert.match(result.stdout, /^\d+\n$/);
      assert.doesNotMatch(result.stderr, BOX);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
