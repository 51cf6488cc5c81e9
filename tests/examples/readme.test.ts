/**
 * The README's "Use it" code runs as written, with the command line the README gives for it, in a
 * project of its own (no `unstable` setting inherited from this repository), and comes to its
 * end without sitting in a watch until its deadline.
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
