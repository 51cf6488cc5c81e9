/**
 * Opens a backend from a JSON {@linkcode StoreSpec} in a child process (a separate node).
 *
 * @example
 * ```ts ignore
 * await using opened = await openBackendFromSpec(JSON.parse(Deno.args[0]), "node-b", { fast: true });
 * await using alloc = await Allocator.open(opened.backend, { max: 1000 });
 * ```
 * @module
 */
import type { Backend } from "../../src/allocator/backend.ts";
import { DenoKvBackend } from "../../src/backends/kv/mod.ts";
import type { NodeBackendOptions, StoreSpec } from "./fixture.ts";
import { kvTimings } from "./kv_fixture.ts";

/** A backend for `node` on the store `spec` describes; disposing it closes the store handle. */
export async function openBackendFromSpec(
  spec: StoreSpec,
  node: string,
  options?: NodeBackendOptions,
): Promise<{ backend: Backend } & AsyncDisposable> {
  switch (spec.kind) {
    case "deno-kv": {
      const kv = await Deno.openKv(spec.path);
      const backend = new DenoKvBackend(kv, { prefix: spec.prefix, node, ...kvTimings(options) });
      return {
        backend,
        [Symbol.asyncDispose]: () => {
          kv.close();
          return Promise.resolve();
        },
      };
    }
    case "etcd": {
      // ETCD branch (owned by the etcd fixture's author): imported lazily so that KV-only children
      // never load the etcd client. `options.fast` is not mapped to etcd knobs yet.
      const { openEtcdBackend } = await import("./etcd_fixture.ts");
      const backend = await openEtcdBackend(spec, node);
      return { backend, [Symbol.asyncDispose]: () => backend.close() };
    }
  }
}
