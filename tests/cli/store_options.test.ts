/**
 * Each backend's own options (its driver's `options`) belong to its stores: help lists them under
 * the backend, and one given with another backend's store is a usage error before anything is
 * opened or written. Driven by the registry, so that a new backend is checked the same way.
 */
import assert from "node:assert/strict";
import { backendOfStore, BACKENDS } from "../../src/backends/registry.ts";
import { longFlag } from "../../src/backends/driver_options.ts";
import { CORE_DAMAGE_KINDS } from "../../src/allocator/damage.ts";
import { cli, isOneLineError, TempStore } from "./_run.ts";

/** A `--store` value of each backend that is never reachable (port 1 refuses at once). */
const STORE_OF: Readonly<Record<string, (store: TempStore) => string>> = {
  "deno-kv": (store) => `kv:${store.path}`,
  "etcd": () => "etcd://127.0.0.1:1",
  "k8s": () => "k8s:/no/such/kubeconfig",
};

/** Arguments that make `option` given on the command line: `--ca x`, `--poll 1s`. */
function given(flags: string): string[] {
  const flag = flags.split(" ")[0];
  const value = flags.includes("<duration>") ? "1s" : "x";
  return flags.includes("<") ? [flag, value] : [flag];
}

Deno.test("help lists each backend's own options under that backend, from its driver", async () => {
  const help = (await cli(["--help"])).stdout;
  const headings = [...help.matchAll(/^(\S.*options.*):$/gm)].map((m) => m.index!);
  for (const driver of BACKENDS) {
    const heading = `${driver.title} store options (--store ${driver.scheme}…):`;
    const start = help.indexOf(heading);
    assert.ok(start >= 0, `no group for ${driver.kind}:\n${help}`);
    const end = headings.find((i) => i > start) ?? help.indexOf("Commands:");
    const group = help.slice(start, end);
    for (const option of driver.options) {
      assert.ok(group.includes(`  ${option.flags}`), `${option.flags} under ${heading}`);
    }
    for (const other of BACKENDS.filter((d) => d !== driver)) {
      for (const option of other.options) {
        assert.ok(
          !group.includes(`  ${longFlag(option)} `),
          `${option.flags} not under ${heading}`,
        );
      }
    }
  }
  const bash = (await cli(["completion", "bash"])).stdout;
  for (const option of BACKENDS.flatMap((d) => d.options)) {
    assert.ok(bash.includes(longFlag(option)), `completion offers ${option.flags}`);
  }
});

Deno.test("an option of another backend is a usage error, and nothing is written", async () => {
  for (const driver of BACKENDS) {
    for (const other of BACKENDS.filter((d) => d !== driver)) {
      for (const option of other.options) {
        await using store = await TempStore.create();
        const spec = STORE_OF[driver.kind](store);
        const args = ["--store", spec, ...given(option.flags), "allocate", "k;"];
        const result = await cli(args);
        const flag = longFlag(option);
        assert.equal(result.code, 1, `${args.join(" ")}: ${result.stderr}`);
        assert.ok(isOneLineError(result.stderr), result.stderr);
        assert.ok(
          result.stderr.includes(`${flag} is for ${other.title}; --store ${spec} is`),
          result.stderr,
        );
        const json = await cli([...args, "--json"]);
        assert.equal(json.code, 1);
        assert.deepEqual(
          [JSON.parse(json.stderr).error.code, JSON.parse(json.stderr).error.name],
          [1, "InvalidOptionsError"],
        );
        assert.deepEqual([...Deno.readDirSync(store.dir)], [], "no store file was created");
      }
    }
  }
});

Deno.test("kv: --ca fails with exit 1 and leaves an existing store as it was", async () => {
  await using store = await TempStore.create();
  assert.equal((await cli([...store.args, "allocate", "k;"])).code, 0);
  const before = await Deno.readFile(store.path);
  const result = await cli([...store.args, "--ca", "ca.pem", "allocate", "other;"]);
  assert.equal(result.code, 1, result.stderr);
  assert.match(result.stderr, /--ca is for etcd; --store kv:.* is a Deno KV store: drop --ca/);
  assert.deepEqual(await Deno.readFile(store.path), before, "the store is untouched");
  const list = JSON.parse((await cli([...store.args, "list", "--json"])).stdout);
  assert.deepEqual(list.map((e: { key: string }) => e.key), ["k;"]);
});

Deno.test("kv: etcd's password from the environment is not an error (it serves every store)", async () => {
  await using store = await TempStore.create();
  const run = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "src/cli/main.ts", ...store.args, "list", "--json"],
    env: { IDALLOC_ETCD_PASSWORD: "s3cret" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const stderr = new TextDecoder().decode(run.stderr);
  assert.equal(run.code, 0, stderr);
  assert.deepEqual(JSON.parse(new TextDecoder().decode(run.stdout)), []);
});

Deno.test("drivers: what --store and a backend's options describe fits the driver's schema", () => {
  for (const driver of BACKENDS) {
    const spec = driver.exampleStore;
    const selected = backendOfStore(spec);
    assert.equal(selected?.driver, driver, spec);
    const values = Object.fromEntries(
      driver.options.filter((o) => o.default !== undefined)
        .map((o) => [longFlag(o).slice(2).replace(/-(.)/g, (_, c) => c.toUpperCase()), o.default]),
    );
    const description = driver.describe(selected!.rest, values, {
      timeoutMs: 30_000,
      leaseTtlMs: 60_000,
    });
    assert.deepEqual(driver.description.parse(description), description, driver.kind);
  }
});

Deno.test("drivers: each declares its own damage kinds, none of them a core kind", () => {
  const seen = new Set(Object.keys(CORE_DAMAGE_KINDS));
  for (const driver of BACKENDS) {
    for (const kind of Object.keys(driver.damageKinds)) {
      assert.ok(!seen.has(kind), `${driver.kind}: ${kind} is declared twice`);
      seen.add(kind);
    }
  }
});

Deno.test("the CLI loads no etcd client for a kv: store (the etcd driver imports it on open)", async () => {
  const info = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", "src/cli/main.ts"],
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(info.code, 0, new TextDecoder().decode(info.stderr));
  const graph = JSON.parse(new TextDecoder().decode(info.stdout));
  type Dep = { code?: { specifier: string }; isDynamic?: boolean };
  const modules = new Map<string, { dependencies?: Dep[] }>(
    graph.modules.map((m: { specifier: string }) => [m.specifier, m]),
  );
  const statics = new Set<string>();
  const todo: string[] = [graph.roots[0]];
  while (todo.length > 0) {
    const specifier = todo.pop()!;
    if (statics.has(specifier)) continue;
    statics.add(specifier);
    for (const dep of modules.get(specifier)?.dependencies ?? []) {
      if (dep.code !== undefined && !dep.isDynamic) todo.push(dep.code.specifier);
    }
  }
  assert.ok([...statics].some((s) => s.endsWith("/src/backends/etcd/driver.ts")), "driver listed");
  const all = [...modules.values()].flatMap((m) => m.dependencies ?? []);
  assert.ok(all.some((d) => d.code?.specifier.includes("etcd3")), "etcd3 is in the whole graph");
  const etcd = [...statics].filter((s) => s.includes("etcd3") || s.endsWith("/etcd/mod.ts"));
  assert.deepEqual(etcd, [], "the etcd client is imported only when an etcd store is opened");
});
