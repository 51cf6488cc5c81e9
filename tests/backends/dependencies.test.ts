// Dependencies point one way: the library never imports the development harnesses (tests/,
// nemesis/, bench/), no published module names a file the package leaves out, outside
// src/backends/ the repository reaches a backend only through the registry (the harness loader
// finds each harness in the folder its driver names) or the backend's package entry
// (`@idalloc/idalloc/etcd`, which the Node.js example imports by path, as Node.js reads no import
// map), a backend imports only src/backends/shared/ and the core (never another backend), and no
// modules of src/ import each other in a circle.
import assert from "node:assert/strict";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, normalize } from "node:path";

const ROOT = new URL("../../", import.meta.url).pathname;

/** Every TypeScript file under `dir` (repository-relative), skipping dependencies and git. */
function sources(dir = ""): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const path = dir === "" ? entry.name : `${dir}/${entry.name}`;
    if (entry.isDirectory()) {
      if (entry.name !== "node_modules" && !entry.name.startsWith(".")) out.push(...sources(path));
    } else if (entry.name.endsWith(".ts")) out.push(path);
  }
  return out;
}

/** A module a file refers to: imported, re-exported, dynamically imported or made a URL of. */
interface Reference {
  readonly file: string;
  readonly line: number;
  /** The target, repository-relative. */
  readonly target: string;
}

// `from "…"` (imports, re-exports), `import "…"`, `import("…")` and `new URL("…", …)`.
const SPECIFIER = /(?:\bfrom\s*|\bimport\s*\(\s*|\bimport\s+|\bnew URL\(\s*)"(\.{1,2}\/[^"]*)"/g;

/** The relative references of `file`, resolved against the repository. */
function references(file: string): Reference[] {
  const text = readFileSync(join(ROOT, file), "utf8");
  return [...text.matchAll(SPECIFIER)].map((m) => ({
    file,
    line: text.slice(0, m.index).split("\n").length,
    target: normalize(join(dirname(file), m[1])),
  }));
}

function show(refs: readonly Reference[]): string {
  return refs.map((r) => `${r.file}:${r.line} → ${r.target}`).join("\n");
}

const files = sources();
const denoJson = JSON.parse(readFileSync(join(ROOT, "deno.json"), "utf8")) as {
  exports: Record<string, string>;
  publish: { exclude: string[] };
};

/** `publish.exclude` as tests of a repository-relative path (`*` is one path segment). */
const excluded: ((path: string) => boolean)[] = denoJson.publish.exclude.map((pattern) => {
  const source = pattern.replace(/[.+?^${}()|[\]\\]/g, "\\$&").replace(/\*/g, "[^/]+");
  const re = new RegExp(`^${source}${pattern.endsWith("/") ? "" : "$"}`);
  return (path) => re.test(path);
});
const isExcluded = (path: string) => excluded.some((test) => test(path));

/** The package's entry modules, repository-relative. */
const entries = new Set(Object.values(denoJson.exports).map((p) => normalize(p)));

/** Backend folders: the folders of `src/backends/` with a driver. */
const backendFolders = readdirSync(join(ROOT, "src/backends"), { withFileTypes: true })
  .filter((e) => e.isDirectory() && existsSync(join(ROOT, "src/backends", e.name, "driver.ts")))
  .map((e) => `src/backends/${e.name}/`);

Deno.test("dependencies: no file in src/ refers to tests/, nemesis/ or bench/", () => {
  const refs = files.filter((f) => f.startsWith("src/")).flatMap(references);
  assert.ok(refs.length > 500, `the scan sees src/'s imports (${refs.length})`);
  const bad = refs.filter((r) => /^(tests|nemesis|bench)\//.test(r.target));
  assert.deepEqual(bad, [], `src/ refers to the harnesses:\n${show(bad)}`);
});

Deno.test("dependencies: no published module refers to a file the package leaves out", () => {
  assert.ok(isExcluded("src/testing/harness.ts") && isExcluded("src/backends/kv/testing/open.ts"));
  const published = files.filter((f) => (f === "mod.ts" || f.startsWith("src/")) && !isExcluded(f));
  assert.ok(published.includes("src/backends/driver.ts"));
  const bad = published.flatMap(references).filter((r) => isExcluded(r.target));
  assert.deepEqual(bad, [], `published modules refer to unpublished ones:\n${show(bad)}`);
});

Deno.test("dependencies: outside src/backends/, a backend is reached through the registry", () => {
  assert.ok(backendFolders.length >= 2, backendFolders.join(", "));
  const outside = files.filter((f) => !f.startsWith("tests/") && !f.startsWith("src/backends/"));
  const reach = outside.flatMap(references)
    .filter((r) => backendFolders.some((folder) => r.target.startsWith(folder)));
  /** The package entries. */
  const allowed = (r: Reference) =>
    entries.has(r.target) ||
    // The `k8s-cilium` and `k8s-scale` bench groups run Cilium's CRD-mode node, which only knows
    // Cilium's own group: they start a server of their own with Cilium's CRDs through the k8s
    // dev-only launcher (`k8s-scale` also reads that server's /metrics); `k8s-memory` weighs a
    // session's index through the dev-only bench helpers.
    (/^bench\/k8s_(cilium|scale(_api)?|memory)\.ts$/.test(r.file) &&
      r.target.startsWith("src/backends/k8s/testing/"));
  // The scan sees what it allows: the package's own entries.
  assert.ok(reach.some((r) => r.file === "mod.ts"), show(reach));
  const bad = reach.filter((r) => !allowed(r));
  assert.deepEqual(bad, [], `non-test files reach into a backend's modules:\n${show(bad)}`);
});

Deno.test("dependencies: a backend imports src/backends/shared/ and the core, never another backend", () => {
  const shared = files.filter((f) => f.startsWith("src/backends/shared/"));
  assert.ok(shared.length > 0);
  const inBackends = files.filter((f) => backendFolders.some((folder) => f.startsWith(folder)));
  const refs = [...inBackends, ...shared].flatMap(references);
  assert.ok(refs.some((r) => r.target.startsWith("src/backends/shared/")), "the scan sees shared/");
  /**
   * Kubernetes' test cluster runs its API server on a private etcd, which etcd's dev-only
   * launcher starts, and the test launcher starts the run's shared etcd beside its API server
   * (none of them is published).
   */
  const allowed = (r: Reference) =>
    (r.file === "src/backends/k8s/testing/cluster.ts" ||
      r.file === "src/backends/k8s/testing/launcher.ts") &&
    r.target === "src/backends/etcd/testing/cluster.ts";
  const lateral = refs.filter((r) =>
    backendFolders.some((folder) => r.target.startsWith(folder) && !r.file.startsWith(folder)) &&
    !allowed(r)
  );
  assert.deepEqual(
    lateral,
    [],
    `a backend (or shared/) imports another backend:\n${show(lateral)}`,
  );
});

/** The import graph of `paths`: each module's relative imports. A module naming itself (a doc
 * example importing its own module) is left out. */
function importGraph(paths: readonly string[]): Map<string, string[]> {
  const graph = new Map<string, string[]>();
  for (const f of paths) {
    graph.set(f, [...new Set(references(f).map((r) => r.target))].filter((t) => t !== f));
  }
  return graph;
}

/**
 * The circles of `graph` (strongly connected sets of more than one module, each sorted), by
 * Tarjan's algorithm; edges to modules outside the graph are ignored.
 */
function circles(graph: ReadonlyMap<string, readonly string[]>): string[][] {
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string) => {
    index.set(v, index.size);
    low.set(v, index.get(v)!);
    stack.push(v);
    onStack.add(v);
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue;
      if (!index.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, index.get(w)!));
    }
    if (low.get(v) !== index.get(v)) return;
    const set: string[] = [];
    for (let w = stack.pop()!;; w = stack.pop()!) {
      onStack.delete(w);
      set.push(w);
      if (w === v) break;
    }
    if (set.length > 1) found.push(set.sort());
  };
  for (const v of graph.keys()) if (!index.has(v)) visit(v);
  return found;
}

Deno.test("dependencies: no modules of src/ import each other in a circle", () => {
  // The check finds a circle where there is one (the harness loader and the harnesses, before).
  const loop = new Map([["loader", ["harness"]], ["harness", ["loader", "lib"]], ["lib", []]]);
  assert.deepEqual(circles(loop), [["harness", "loader"]]);
  const graph = importGraph(files.filter((f) => f.startsWith("src/")));
  assert.ok(graph.get("src/testing/harness.ts")?.includes("src/backends/registry.ts"));
  const found = circles(graph);
  assert.deepEqual(found, [], `import circles:\n${found.map((c) => c.join(" ↔ ")).join("\n")}`);
});
