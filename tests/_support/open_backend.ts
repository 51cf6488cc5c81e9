/**
 * Opens a backend from a JSON {@linkcode StoreSpec} in a child process (a separate node), through
 * the harness of the spec's kind (found in the registry): no list of backends here.
 *
 * @example
 * ```ts ignore
 * // Runs in a child process given a spec; tests/conformance/_processes.ts does so.
 * await using opened = await openBackendFromSpec(JSON.parse(Deno.args[0]), "node-b", { fast: true });
 * await using alloc = await Allocator.open(opened.backend, { max: 1000 });
 * ```
 * @module
 */
import type { Backend } from "../../src/allocator/backend.ts";
import { loadHarness } from "../../src/testing/harness.ts";
import type { NodeBackendOptions, StoreSpec } from "../../src/testing/fixture.ts";

/** A backend for `node` on the store `spec` describes; disposing it closes the store handle. */
export async function openBackendFromSpec(
  spec: StoreSpec,
  node: string,
  options?: NodeBackendOptions,
): Promise<{ backend: Backend } & AsyncDisposable> {
  const harness = await loadHarness(spec.kind);
  return await harness.fixture.openFromSpec(spec, node, options);
}
