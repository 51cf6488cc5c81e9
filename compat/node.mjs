/**
 * The entry of the Node.js hook: `node --import ./compat/node.mjs app.ts`. Plain JavaScript, so
 * that every Node.js can load it and say what is wrong: below Node.js 24 the TypeScript source
 * cannot run (no type stripping, no `using` declarations, no `module.registerHooks`), and loading
 * `node.ts` itself would end in a raw `ERR_UNKNOWN_FILE_EXTENSION` stack trace.
 *
 * @module
 */
import * as nodeModule from "node:module";
import process from "node:process";

const major = Number(process.versions.node.split(".")[0]);
if (major < 24 || typeof nodeModule.registerHooks !== "function") {
  process.stderr.write(
    `idalloc needs Node.js 24 or later; this is Node.js ${process.version} (${process.execPath})\n`,
  );
  process.exit(1);
}
await import("./node.ts");
