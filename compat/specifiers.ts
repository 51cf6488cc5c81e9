/**
 * What the Node.js hook (`node.ts`) and the Bun preload (`bun.ts`) map so that the checkout's
 * TypeScript runs unchanged on both: `npm:name@range/sub/path` → `name/sub/path`. The source names
 * its npm dependencies by full `npm:` specifiers (see `src/deps/`), a scheme only Deno knows.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * assert.equal(bareNpmSpecifier("npm:@logtape/logtape@^2.4.2"), "@logtape/logtape");
 * assert.equal(bareNpmSpecifier("npm:etcd3@1.1.2/lib/x.js"), "etcd3/lib/x.js");
 * assert.equal(bareNpmSpecifier("node:fs"), undefined);
 * ```
 * @module
 */

/** The bare package specifier for an `npm:` one, or `undefined` if `specifier` is not one. */
export function bareNpmSpecifier(specifier: string): string | undefined {
  if (!specifier.startsWith("npm:")) return undefined;
  const rest = specifier.slice(4).replace(/^\//, "");
  const match = /^((?:@[^/@]+\/)?[^/@]+)(?:@[^/]*)?(\/.*)?$/.exec(rest);
  if (!match) return undefined;
  return match[1] + (match[2] ?? "");
}
