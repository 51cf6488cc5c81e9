/**
 * The documentation holds together (issue 36): every relative link and `#anchor` of the README and
 * of `docs/` resolves (GitHub's heading anchors), every page is linked from the README, starts with a
 * one-paragraph summary and links back to the README's contents, and every code block of the pages
 * runs under `deno task test` as an assertion, is a function that needs a server (type-checked by
 * `deno task check`, not called), or says why it is ignored.
 */
import assert from "node:assert/strict";
import { dirname, join, normalize } from "node:path";
import { brokenLinks, githubSlug, markdownFiles, parseMarkdown } from "../_support/markdown.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const PAGES = await markdownFiles(ROOT, "docs");
const read = (file: string) => Deno.readTextFile(join(ROOT, file));

Deno.test("docs: every relative link and #anchor of the README and docs/ resolves", async () => {
  assert.ok(PAGES.length >= 15, `${PAGES.length} pages under docs/`);
  const broken = await brokenLinks(ROOT, ["README.md", ...PAGES]);
  assert.deepEqual(
    broken.map((b) => `${b.file}:${b.line}: ${b.target} — ${b.problem}`),
    [],
  );
});

Deno.test("docs: the link check reports a missing file, a missing anchor, and nothing else", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-docs-" });
  try {
    await Deno.mkdir(`${dir}/docs`);
    await Deno.writeTextFile(
      `${dir}/README.md`,
      "# Top\n\n## GC's pace\n\n[ok](docs/a.md#options-allocatoropenbackend-options) " +
        "[self](#gcs-pace) [web](https://example.com/x.md#nope)\n[gone](docs/b.md)\n" +
        "```sh\n# not a heading; [not a link](nowhere.md)\n```\n`[code](nowhere.md)`\n",
    );
    await Deno.writeTextFile(
      `${dir}/docs/a.md`,
      "# A\n\n## Options (`Allocator.open(backend, options)`)\n\n[back](../README.md#not-here)\n",
    );
    const broken = await brokenLinks(dir, ["README.md", "docs/a.md"]);
    assert.deepEqual(broken.map((b) => [b.file, b.line, b.target]), [
      ["README.md", 6, "docs/b.md"],
      ["docs/a.md", 5, "../README.md#not-here"],
    ]);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("docs: anchors are GitHub's", () => {
  // As github.com renders them (github-slugger), checked against these pages' own headings.
  const cases: [string, string][] = [
    ["Options (`Allocator.open(backend, options)`)", "options-allocatoropenbackend-options"],
    ["GC's pace", "gcs-pace"],
    ["1. A local API server with Cilium's CRDs", "1-a-local-api-server-with-ciliums-crds"],
    ["Later: Cilium v1.17's double-write modes", "later-cilium-v117s-double-write-modes"],
    ["Nemesis suite (`deno task nemesis`)", "nemesis-suite-deno-task-nemesis"],
    ["Node.js and Bun", "nodejs-and-bun"],
    ["Speed — on [three](x.md) runtimes", "speed--on-three-runtimes"],
    ["snake_case **bold**", "snake_case-bold"],
  ];
  for (const [heading, slug] of cases) assert.equal(githubSlug(heading), slug, heading);
  const { anchors } = parseMarkdown("# A\n## Notes\n```md\n## Notes\n```\n### Notes\n");
  assert.deepEqual([...anchors], ["a", "notes", "notes-1"]);
});

Deno.test("docs: every page is linked from the README", async () => {
  const linked = new Set(
    parseMarkdown(await read("README.md")).links
      .map((l) => l.target.split("#")[0])
      .filter((t) => t.startsWith("docs/")),
  );
  assert.deepEqual(PAGES.filter((p) => !linked.has(p)), [], "pages the README does not link");
});

Deno.test("docs: every page starts with its title, a summary and links back to the contents", async () => {
  for (const page of PAGES) {
    const paragraphs = (await read(page)).split(/\n{2,}/);
    const [title, summary] = paragraphs;
    assert.match(title, /^# \S/, `${page}: starts with its title`);
    assert.doesNotMatch(summary, /^(#|```|[-*|] |\[)/, `${page}: a summary paragraph follows`);
    assert.ok(summary.split(" ").length >= 20, `${page}: the summary says what the page holds`);
    // The partial-commit note is a report linked from Data layout; the guide's pages carry the
    // navigation line under their summary and at their end.
    if (page === "docs/deno-kv-partial-commit.md") continue;
    const contents = /\]\((?:\.\.\/)+README\.md#documentation\)/;
    assert.match(paragraphs[2], contents, `${page}: links back to the README's contents`);
    assert.match(paragraphs.at(-1)!, contents, `${page}: ends with the navigation line`);
  }
});

Deno.test("docs: each code block of the pages asserts, needs a server, or says why it is ignored", async () => {
  // `deno task test` runs the blocks of docs/ (`deno test --doc docs/`) and `deno task check`
  // type-checks them: one that needs a server is a function, type-checked and not called.
  const tasks = JSON.parse(await read("deno.json")).tasks as Record<string, string>;
  assert.match(tasks.test, /--doc .* docs\//, "the test task runs the pages' blocks");
  assert.match(
    tasks.check,
    /--doc-only README\.md docs\/\*\*\/\*\.md/,
    "the check task checks them",
  );
  let asserting = 0;
  for (const page of PAGES) {
    for (const { info, code, line } of parseMarkdown(await read(page)).blocks) {
      const [lang, ...attributes] = info.split(/\s+/);
      if (!["ts", "js", "tsx", "jsx", "typescript", "javascript"].includes(lang)) continue;
      const where = `${page}:${line}`;
      if (attributes.includes("ignore")) {
        assert.match(code, /^\/\/ ignored: /, `${where}: ignored without a reason`);
        continue;
      }
      assert.doesNotMatch(code, /console\.log/, `${where}: prints instead of asserting`);
      if (/\bassert\b/.test(code)) asserting++;
      else {
        assert.match(code, /\/\/ Needs /, `${where}: neither asserts nor says what it needs`);
        assert.doesNotMatch(code, /^await /m, `${where}: needs a server yet runs at the top level`);
      }
    }
  }
  assert.ok(asserting >= 3, `${asserting} asserting blocks`);
});

Deno.test("docs: what the README and the pages link to is published with them", async () => {
  // JSR shows the README as the package's page and resolves its relative links in the package.
  const { include, exclude } = JSON.parse(await read("deno.json")).publish as {
    include: string[];
    exclude: string[];
  };
  const under = (path: string, entries: string[]) =>
    entries.some((e) => (e.endsWith("/") ? path.startsWith(e) : path === e));
  const unpublished: string[] = [];
  for (const file of ["README.md", ...PAGES]) {
    for (const { target, line } of parseMarkdown(await read(file)).links) {
      const path = target.split("#")[0];
      if (path === "" || /^[a-z][a-z0-9+.-]*:/i.test(path)) continue;
      const resolved = normalize(join(dirname(file), path));
      if (!under(resolved, include) || under(resolved, exclude)) {
        unpublished.push(`${file}:${line}: ${target}`);
      }
    }
  }
  assert.deepEqual(unpublished, [], "links to files the package leaves out");
});
