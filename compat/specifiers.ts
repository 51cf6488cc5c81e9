/**
 * What the Node.js hook (`node.ts`) and the Bun preload (`bun.ts`) map so that the checkout's
 * TypeScript runs unchanged on both: `npm:name@range/sub/path` → `name/sub/path`. The source names
 * its npm dependencies by full `npm:` specifiers (see `src/deps/`), a scheme only Deno knows.
 *
 * They also map the package's own names (`@idalloc/idalloc`, `@idalloc/idalloc/etcd`, … as
 * `deno.json` exports them) to this checkout's files, so that an application in a folder of its
 * own imports the checkout by the names it will import the published package by.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * assert.equal(bareNpmSpecifier("npm:@logtape/logtape@^2.4.2"), "@logtape/logtape");
 * assert.equal(bareNpmSpecifier("npm:etcd3@1.1.2/lib/x.js"), "etcd3/lib/x.js");
 * assert.equal(bareNpmSpecifier("node:fs"), undefined);
 * assert.match(packageEntry("@idalloc/idalloc/etcd")!, /\/src\/backends\/etcd\/mod\.ts$/);
 * assert.equal(packageEntry("@idalloc/idalloc/nope"), undefined);
 * ```
 * @module
 */
import denoJson from "../deno.json" with { type: "json" };

const ROOT = new URL("../", import.meta.url);

/** The bare package specifier for an `npm:` one, or `undefined` if `specifier` is not one. */
export function bareNpmSpecifier(specifier: string): string | undefined {
  if (!specifier.startsWith("npm:")) return undefined;
  const rest = specifier.slice(4).replace(/^\//, "");
  const match = /^((?:@[^/@]+\/)?[^/@]+)(?:@[^/]*)?(\/.*)?$/.exec(rest);
  if (!match) return undefined;
  return match[1] + (match[2] ?? "");
}

/**
 * The package's names (`@idalloc/idalloc`, `@idalloc/idalloc/kv`, … as `deno.json` exports them),
 * each with the `file:` URL of this checkout's module.
 */
export function packageEntries(): Map<string, string> {
  return new Map(
    Object.entries(denoJson.exports as Record<string, string>).map(([sub, path]) => [
      denoJson.name + sub.slice(1),
      new URL(path, ROOT).href,
    ]),
  );
}

/** The `file:` URL of the checkout's module of one of the package's names, else `undefined`. */
export function packageEntry(specifier: string): string | undefined {
  return packageEntries().get(specifier);
}
