/**
 * Runs idalloc's TypeScript source from a checkout on Node.js ≥ 24: `node --import
 * ./compat/node.mjs app.ts` (`node.mjs` checks the version, in JavaScript every Node.js can load,
 * then loads this hook). The source names its npm dependencies by full `npm:` specifiers
 * (`npm:zod@^4.6.7`, see `src/deps/`) so that Deno resolves them with no import map; Node has no
 * `npm:` scheme, so this hook maps each one to the bare package name (`zod`, `etcd3/sub`), which
 * Node then finds in the checkout's `node_modules` (made by `deno install`). It also maps the
 * package's own names (`@idalloc/idalloc`, `@idalloc/idalloc/etcd`, …) to the checkout's files,
 * so an application in a folder of its own imports them as it will import the published package.
 * A package installed from JSR needs no hook: JSR rewrites `npm:` specifiers in the npm tarballs
 * it serves.
 *
 * @example
 * ```sh
 * node --import ./compat/node.mjs examples/node/main.ts
 * ```
 * @module
 */
import * as nodeModule from "node:module";
import process from "node:process";
import { bareNpmSpecifier, packageEntry } from "./specifiers.ts";

// Below 24 the source does not even parse (`using` declarations): say so instead.
const major = Number(process.versions.node.split(".")[0]);
if (major < 24 || typeof nodeModule.registerHooks !== "function") {
  throw new Error(`idalloc needs Node.js 24 or later; this is ${process.version}`);
}
const { registerHooks } = nodeModule;

registerHooks({
  resolve(specifier, context, nextResolve) {
    return nextResolve(
      packageEntry(specifier) ?? bareNpmSpecifier(specifier) ?? specifier,
      context,
    );
  },
});
