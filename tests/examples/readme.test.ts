/**
 * The README's "Use it" code runs as written, with the command line the README gives for it, in a
 * project of its own (no `unstable` setting inherited from this repository), and comes to its
 * end without sitting in a watch until its deadline; module examples print what their comments say.
 */
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url).pathname;

/** The first `ts` block of the README section titled `title`. */
async function readmeCode(title: string): Promise<string> {
  const readme = await Deno.readTextFile(`${ROOT}README.md`);
  const section = readme.slice(readme.indexOf(`## ${title}\n`));
  const code = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(code, `no ts block under ## ${title}`);
  return code;
}

Deno.test("README: the 'Use it' code runs as written and ends before its deadline", async () => {
  const readme = await Deno.readTextFile(`${ROOT}README.md`);
  const command = /`(deno run [^`]*--unstable-kv[^`]*) main\.ts`/.exec(readme)?.[1];
  assert.ok(command, "the README says how to run code that opens Deno KV");
  const repo = JSON.parse(await Deno.readTextFile(`${ROOT}deno.json`));
  const dir = await Deno.makeTempDir({ prefix: "idalloc-readme-" });
  try {
    const npm = Object.fromEntries(
      Object.entries(repo.imports as Record<string, string>).filter(([, v]) =>
        v.startsWith("npm:")
      ),
    );
    await Deno.writeTextFile(
      `${dir}/deno.json`,
      JSON.stringify({ imports: { ...npm, "@idalloc/idalloc": `${ROOT}mod.ts` } }),
    );
    const code = await readmeCode("Use it");
    // Its own deadline tells whether the code waited for it: a watch left open sits until then.
    await Deno.writeTextFile(
      `${dir}/main.ts`,
      `${code}\nconsole.log(JSON.stringify({ done: true, deadlinePassed: signal.aborted }));\n`,
    );
    const out = await new Deno.Command(Deno.execPath(), {
      args: [...command.split(" ").slice(1), "main.ts"],
      cwd: dir,
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(out.stderr);
    assert.equal(out.code, 0, stderr);
    assert.deepEqual(JSON.parse(new TextDecoder().decode(out.stdout)), {
      done: true,
      deadlinePassed: false,
    });
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** The first `ts` example of a module's documentation, without the comment's ` * `. */
async function moduleExample(path: string): Promise<string> {
  const source = await Deno.readTextFile(`${ROOT}${path}`);
  const code = /```ts\n([\s\S]*?) \* ```/.exec(source)?.[1];
  assert.ok(code, `no ts example in ${path}`);
  return code.split("\n").map((line) => line.replace(/^ \* ?/, "")).join("\n");
}

Deno.test("module docs: the printed values in the examples are the real ones", async () => {
  const repo = JSON.parse(await Deno.readTextFile(`${ROOT}deno.json`));
  for (const path of ["src/allocator/allocator.ts", "src/identity/mod.ts"]) {
    const code = await moduleExample(path);
    const dir = await Deno.makeTempDir({ prefix: "idalloc-doc-" });
    try {
      const imports = Object.fromEntries(
        Object.entries(repo.imports as Record<string, string>)
          .map(([k, v]) => [k, v.startsWith("./") ? `${ROOT}${v.slice(2)}` : v]),
      );
      await Deno.writeTextFile(`${dir}/deno.json`, JSON.stringify({ imports }));
      await Deno.writeTextFile(`${dir}/main.ts`, code);
      const out = await new Deno.Command(Deno.execPath(), {
        args: ["run", "-A", "--unstable-kv", "--config", `${dir}/deno.json`, `${dir}/main.ts`],
        cwd: ROOT,
        stdout: "piped",
        stderr: "piped",
      }).output();
      assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
      const printed = new TextDecoder().decode(out.stdout).trim().split("\n");
      // `console.log(…); // what it prints` (a comment may go on after a colon).
      const promised = [...code.matchAll(/console\.log\(.*\); \/\/ (.*)$/gm)].map((m) => m[1]);
      assert.equal(printed.length, promised.length, `${path}: ${printed.join(" | ")}`);
      printed.forEach((line, i) => {
        const comment = promised[i];
        assert.ok(
          comment === line || comment.startsWith(`${line}: `),
          `${path}: prints '${line}', its comment says '${comment}'`,
        );
      });
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  }
});
