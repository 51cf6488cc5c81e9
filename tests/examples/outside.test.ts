/**
 * The library is usable from outside this repository: every entry point that `deno.json` exports
 * resolves and type-checks from a directory with no configuration, and the npm packages the
 * library names in full (in `src/deps/`) are the ones the repository's import map (and lock) pins,
 * so tests run what users get.
 */
import assert from "node:assert/strict";

const ROOT = new URL("../../", import.meta.url).pathname;

interface DenoJson {
  readonly exports: Record<string, string>;
  readonly imports: Record<string, string>;
}

async function denoJson(): Promise<DenoJson> {
  return JSON.parse(await Deno.readTextFile(`${ROOT}deno.json`));
}

Deno.test("every exported entry point type-checks from a directory with no deno.json", async () => {
  const { exports } = await denoJson();
  const dir = await Deno.makeTempDir({ prefix: "idalloc-outside-" });
  try {
    const lines = Object.values(exports).map((path) =>
      `import ${JSON.stringify(new URL(path, `file://${ROOT}`).href)};`
    );
    await Deno.writeTextFile(`${dir}/main.ts`, `${lines.join("\n")}\n`);
    // `--unstable-kv` only for the Deno KV types the library declares; no import map applies.
    const out = await new Deno.Command(Deno.execPath(), {
      args: ["check", "--unstable-kv", "main.ts"],
      cwd: dir,
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** Every `from "…"` / `import("…")` specifier of the library's source files (not doc examples). */
async function librarySpecifiers(): Promise<{ file: string; specifier: string }[]> {
  const found: { file: string; specifier: string }[] = [];
  const scan = async (file: string): Promise<void> => {
    for (const line of (await Deno.readTextFile(`${ROOT}${file}`)).split("\n")) {
      if (/^\s*(\/\/|\*)/.test(line)) continue;
      // Not a flag such as "--import" (src/testing/runtime.ts passes it to Node.js).
      for (const m of line.matchAll(/(?<![\w-])(?:from|import)\s*\(?\s*"([^"]+)"/g)) {
        found.push({ file, specifier: m[1] });
      }
    }
  };
  const visit = async (dir: string): Promise<void> => {
    for await (const entry of Deno.readDir(`${ROOT}${dir}`)) {
      const path = `${dir}/${entry.name}`;
      if (entry.isDirectory) await visit(path);
      else if (entry.name.endsWith(".ts")) await scan(path);
    }
  };
  await visit("src");
  await scan("mod.ts");
  return found;
}

Deno.test("the library imports by path or full npm: specifier, as the import map pins them", async () => {
  const { imports } = await denoJson();
  // `npm:@scope/name@range` and `npm:name@range` → the package's name.
  const packageOf = (specifier: string) => specifier.replace(/^npm:(@?[^@]+)@.*$/, "$1");
  const pinned = new Map(
    Object.values(imports).filter((v) => v.startsWith("npm:")).map((v) => [packageOf(v), v]),
  );
  const found = await librarySpecifiers();
  assert.ok(found.length > 100, `only ${found.length} imports found`);
  for (const { file, specifier } of found) {
    if (specifier.startsWith(".") || specifier.startsWith("node:")) continue;
    assert.ok(specifier.startsWith("npm:"), `${file}: "${specifier}" needs an import map`);
    const name = packageOf(specifier);
    assert.equal(
      specifier,
      pinned.get(name),
      `${file}: "${specifier}" is not what deno.json's import map pins for ${name}`,
    );
  }
});
