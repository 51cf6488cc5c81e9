/**
 * Runs idalloc's TypeScript source from a checkout on Bun: `bun --preload ./compat/bun.ts
 * app.ts`. Like `node.ts`: maps the source's `npm:name@range` specifiers to bare package names,
 * which Bun finds in the checkout's `node_modules` (made by `deno install`), and the package's own
 * names (`@idalloc/idalloc`, `@idalloc/idalloc/etcd`, …) to the checkout's files.
 *
 * @example
 * ```sh
 * bun --preload ./compat/bun.ts examples/node/main.ts
 * ```
 * @module
 */
import { dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { bareNpmSpecifier, packageEntries } from "./specifiers.ts";

/** The part of Bun's global this preload uses (Bun's types are not a dependency). */
interface BunRuntime {
  plugin(plugin: {
    name: string;
    setup(build: {
      onResolve(
        options: { filter: RegExp; namespace?: string },
        resolve: (args: { path: string; importer: string }) => { path: string } | undefined,
      ): void;
      module(specifier: string, load: () => { contents: string; loader: "ts" }): void;
    }): void;
  }): void;
  resolveSync(specifier: string, from: string): string;
}

const bun = (globalThis as unknown as { Bun: BunRuntime }).Bun;

bun.plugin({
  name: "idalloc npm: specifiers",
  setup(build) {
    // Bun reads `npm:x` as path `x` in namespace `npm`, and asks plugins before it fails.
    build.onResolve({ filter: /.*/, namespace: "npm" }, (args) => {
      const bare = bareNpmSpecifier(`npm:${args.path}`);
      if (bare === undefined) return undefined;
      return { path: bun.resolveSync(bare, dirname(args.importer)) };
    });
    // The package's own names, for an application outside the checkout: as virtual modules that
    // re-export the checkout's (a runtime plugin's onResolve is never asked about a bare
    // specifier: oven-sh/bun#40579).
    for (const [name, url] of packageEntries()) {
      const contents = `export * from ${JSON.stringify(fileURLToPath(url))};`;
      build.module(name, () => ({ contents, loader: "ts" }));
    }
  },
});
