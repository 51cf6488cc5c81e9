/**
 * The README's code runs as written, with the command line the README gives for it, in a project
 * of its own (a directory with no `deno.json`: no import map, `unstable` setting or anything else
 * inherited from this repository), importing this checkout by path as the README tells a user
 * without JSR to; the "Use it" code comes to its end without sitting in a watch until its
 * deadline; the README's command that installs the CLI works; module examples print what their
 * comments say.
 */
import assert from "node:assert/strict";
import { etcdUnavailable, startEtcd } from "../../src/backends/etcd/testing/cluster.ts";
import { loadHarness } from "../../src/testing/harness.ts";
import { runCommand, userEnv } from "../_support/commands.ts";

const ROOT = new URL("../../", import.meta.url).pathname;

/** The first `ts` block of the README section titled `title`. */
async function readmeCode(title: string): Promise<string> {
  const readme = await Deno.readTextFile(`${ROOT}README.md`);
  const section = readme.slice(readme.indexOf(`## ${title}\n`));
  const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(code, `no ts block under ## ${title}`);
  return code;
}

/**
 * `code` importing this checkout by path instead of by its JSR names, as the README tells a user
 * without JSR to do: `@idalloc/idalloc[/sub]` becomes the file of that export in `deno.json`.
 */
async function byPath(code: string): Promise<string> {
  const repo = JSON.parse(await Deno.readTextFile(`${ROOT}deno.json`));
  const exports = repo.exports as Record<string, string>;
  return code.replace(/"@idalloc\/idalloc((?:\/[a-z0-9]+)?)"/g, (whole, sub: string) => {
    const target = exports[`.${sub}`];
    assert.ok(target, `the README imports ${whole}, which deno.json does not export`);
    return JSON.stringify(new URL(target, `file://${ROOT}`).href);
  });
}

/**
 * A user's own project: a temporary directory with no `deno.json` (nor one above it), so nothing
 * of this repository's configuration (import map, `unstable`, `nodeModulesDir`) applies.
 */
async function userProject<T>(t: (dir: string) => Promise<T>): Promise<T> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-user-" });
  try {
    for (let up = dir; up !== "/"; up = up.slice(0, up.lastIndexOf("/")) || "/") {
      for (const name of ["deno.json", "deno.jsonc", "package.json"]) {
        await assert.rejects(Deno.stat(`${up}/${name}`), Deno.errors.NotFound, `${up}/${name}`);
      }
    }
    return await t(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** Runs `deno <args>` in `cwd`; the exit code and both outputs. */
function deno(args: string[], cwd: string, env?: Record<string, string>) {
  return runCommand(Deno.execPath(), { args, cwd, env: userEnv(env), clearEnv: true });
}

Deno.test("README: the 'Use it' code runs as written from a project with no deno.json", async () => {
  const readme = await Deno.readTextFile(`${ROOT}README.md`);
  const command = /`(deno run [^`]*--unstable-kv[^`]*) main\.ts`/.exec(readme)?.[1];
  assert.ok(command, "the README says how to run code that opens Deno KV");
  await userProject(async (dir) => {
    const code = await byPath(await readmeCode("Use it"));
    // Its own deadline tells whether the code waited for it: a watch left open sits until then.
    // What `entries()` held right after `allocate` is what the README's comment promises.
    await Deno.writeTextFile(
      `${dir}/main.ts`,
      code.replace(
        "for (const [id, key] of alloc.entries()) {}",
        "const listed = [...alloc.entries()];",
      ) +
        `\nconsole.log(JSON.stringify({ listed, deadlinePassed: signal.aborted }));\n`,
    );
    const out = await deno([...command.split(" ").slice(1), "main.ts"], dir);
    assert.equal(out.code, 0, out.stderr);
    const promised = /alloc\.entries\(\)\) \{\} \/\/ .*: (\[\[.*\]\])$/m.exec(code)?.[1];
    assert.ok(promised, "the README says what entries() holds");
    assert.deepEqual(JSON.parse(out.stdout), {
      listed: JSON.parse(promised),
      deadlinePassed: false,
    });
  });
});

Deno.test({
  name: "README: the etcd code runs from a project with no deno.json, with the permissions given",
  ignore: etcdUnavailable() !== undefined,
  fn: async () => {
    const readme = await Deno.readTextFile(`${ROOT}README.md`);
    const command = /^(deno run --allow-net=127\.0\.0\.1:2379 .*) main\.ts$/m.exec(readme)?.[1];
    assert.ok(command, "the README says how to run the etcd code");
    const section = readme.slice(readme.indexOf("### On etcd\n"));
    const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
    assert.ok(code !== undefined && code.includes("EtcdBackend.connect"), "no etcd code");
    await using etcd = await startEtcd();
    const address = new URL(etcd.endpoints[0]).host;
    await userProject(async (dir) => {
      await Deno.writeTextFile(
        `${dir}/main.ts`,
        (await byPath(code)).replaceAll("127.0.0.1:2379", address) +
          "console.log(JSON.stringify({ id }));\n",
      );
      const args = command.replace("127.0.0.1:2379", address).split(" ").slice(1);
      const out = await deno([...args, "main.ts"], dir);
      assert.equal(out.code, 0, out.stderr);
      const { id } = JSON.parse(out.stdout);
      assert.ok(Number.isSafeInteger(id) && id >= 256 && id <= 65535, out.stdout);
    });
  },
});

const k8s = await loadHarness("k8s");

Deno.test({
  name: "README: the Kubernetes code runs from a project with no deno.json, on a real API server",
  ignore: k8s.unavailable() !== undefined,
  fn: async () => {
    const readme = await Deno.readTextFile(`${ROOT}README.md`);
    const command = /^(deno run --allow-net=127\.0\.0\.1:6443 .*) main\.ts$/m.exec(readme)?.[1];
    assert.ok(command, "the README says how to run the Kubernetes code");
    const section = readme.slice(readme.indexOf("### On Kubernetes\n"));
    const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
    assert.ok(code !== undefined && code.includes("K8sBackend.connect"), "no Kubernetes code");
    // What `deno task k8s:apiserver` gives a user: an API server with Cilium's CRDs and an
    // administrator's kubeconfig, which the snippet names as ./kubeconfig.
    await using server = await k8s.server?.();
    assert.ok(server?.kubeconfig !== undefined, "the harness starts an API server");
    const kubeconfig = server.kubeconfig;
    const address = new URL(server.endpoints[0]).host;
    await userProject(async (dir) => {
      await Deno.copyFile(kubeconfig, `${dir}/kubeconfig`);
      await Deno.writeTextFile(
        `${dir}/main.ts`,
        (await byPath(code)) + "console.log(JSON.stringify({ id }));\n",
      );
      const args = command.replace("127.0.0.1:6443", address).split(" ").slice(1);
      const out = await deno([...args, "main.ts"], dir);
      assert.equal(out.code, 0, out.stderr);
      const { id } = JSON.parse(out.stdout);
      assert.ok(Number.isSafeInteger(id) && id >= 256 && id <= 65535, out.stdout);
    });
  },
});

Deno.test("README: the CLI's install command works as written; the command runs anywhere", async () => {
  const readme = await Deno.readTextFile(`${ROOT}README.md`);
  const command = /^(deno install -g [^#\n]*?)\s*(?:#.*)?$/m.exec(readme)?.[1];
  assert.ok(command, "the README says how to install the CLI");
  const name = /-n (\S+)/.exec(command)?.[1];
  assert.ok(name);
  const root = await Deno.makeTempDir({ prefix: "idalloc-install-" });
  // An installed command, run in a user's directory; the script it is runs `deno` from PATH.
  const run = (bin: string, args: string[]) =>
    userProject((dir) =>
      runCommand(`${root}/bin/${bin}`, {
        args,
        cwd: dir,
        env: userEnv({
          PATH: `${Deno.execPath().replace(/\/[^/]*$/, "")}:${Deno.env.get("PATH") ?? ""}`,
        }),
        clearEnv: true,
      })
    );
  try {
    // As written, in a checkout; DENO_INSTALL_ROOT keeps it out of the user's own bin.
    const installed = await deno(command.split(" ").slice(1), ROOT, { DENO_INSTALL_ROOT: root });
    assert.equal(installed.code, 0, installed.stderr);
    // A fresh install root is a first run: Deno's "Ignored build scripts … npm:protobufjs" box
    // would show now, unless the repository's allowScripts setting came along (-c deno.json).
    assert.doesNotMatch(installed.stderr, /Ignored build scripts/);
    const allocated = await run(name, ["--store", "kv:ids.kv", "allocate", "app=web;"]);
    assert.equal(allocated.code, 0, allocated.stderr);
    assert.match(allocated.stdout, /^ID \d+ for app=web; \(created\)$/m);
    assert.doesNotMatch(allocated.stderr, /Ignored build scripts/);
    // Installed without the settings the README gives (Deno KV's unstable flag among them), a KV
    // store is a usage error that names the flag.
    const bare = command.replace(" -c deno.json", "").replace(`-n ${name}`, `-n ${name}-bare`);
    assert.notEqual(bare, command);
    const plain = await deno(bare.split(" ").slice(1), ROOT, { DENO_INSTALL_ROOT: root });
    assert.equal(plain.code, 0, plain.stderr);
    const refused = await run(`${name}-bare`, ["--store", "kv:ids.kv", "list"]);
    assert.equal(refused.code, 1, refused.stderr);
    assert.match(refused.stderr, /^idalloc: Deno KV needs Deno's --unstable-kv flag/m);
  } finally {
    await Deno.remove(root, { recursive: true });
  }
});

/** The first `ts` example of a module's documentation, without the comment's ` * `. */
/** Every `ts` code block of the JSDoc in `source`, with its info string. */
function docExamples(source: string): { info: string; code: string }[] {
  return [...source.matchAll(/^ \* ```(ts[^\n]*)\n([\s\S]*?)^ \* ```$/gm)].map((m) => ({
    info: m[1].trim(),
    code: m[2].split("\n").map((line) => line.replace(/^ \* ?/, "")).join("\n"),
  }));
}

Deno.test("module docs: examples assert what they show, or say why they cannot run", async () => {
  // `deno task test` runs every example under `deno test --doc`: an example that asserts is
  // checked there. One that needs a live store is a function (type-checked, not called) and says
  // so; an ignored one says why beside it.
  const files: string[] = [];
  const walk = async (dir: string) => {
    for await (const entry of Deno.readDir(`${ROOT}${dir}`)) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory && entry.name !== "testing") await walk(path);
      else if (entry.isFile && path.endsWith(".ts")) files.push(path);
    }
  };
  await walk("src");
  files.push("mod.ts");
  let asserting = 0;
  for (const path of files) {
    for (const { info, code } of docExamples(await Deno.readTextFile(`${ROOT}${path}`))) {
      const where = `${path}: ${code.split("\n").find((l) => l.trim()) ?? ""}`;
      if (info === "ts ignore") {
        assert.match(code.split("\n")[0], /^\/\/ ignored: /, `${where}: ignored without a reason`);
        continue;
      }
      assert.equal(info, "ts", where);
      assert.doesNotMatch(code, /console\.log/, `${where}: prints instead of asserting`);
      if (/\bassert\b/.test(code)) asserting++;
      else assert.match(code, /\/\/ Needs /, `${where}: neither asserts nor says what it needs`);
    }
  }
  assert.ok(asserting >= 30, `${asserting} asserting examples`);
});
