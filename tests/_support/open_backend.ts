/**
 * Opens a backend from a JSON {@linkcode StoreSpec} in a child process (a separate node), through
 * the fixture module the spec names: no list of backends here.
 *
 * @example
 * ```ts ignore
 * await using opened = await openBackendFromSpec(JSON.parse(Deno.args[0]), "node-b", { fast: true });
 * await using alloc = await Allocator.open(opened.backend, { max: 1000 });
 * ```
 * @module
 */
import type { Backend } from "../../src/allocator/backend.ts";
import type { NodeBackendOptions, OpenFromSpec, StoreSpec } from "./fixture.ts";

/** A backend for `node` on the store `spec` describes; disposing it closes the store handle. */
export async function openBackendFromSpec(
  spec: StoreSpec,
  node: string,
  options?: NodeBackendOptions,
): Promise<{ backend: Backend } & AsyncDisposable> {
  const module = await import(spec.module) as { openFromSpec?: OpenFromSpec };
  if (typeof module.openFromSpec !== "function") {
    throw new Error(`${spec.module} does not export openFromSpec`);
  }
  return await module.openFromSpec(spec, node, options);
}
