/**
 * Every backend idalloc's tools can use. A new backend adds its driver here (and its exports to
 * `deno.json`); the CLI, the nemesis suite, the benchmarks and the shared test suites find
 * backends only through this list.
 *
 * @module
 */
import type { BackendDriver } from "./driver.ts";

/** Every backend, in the order tools list them. */
export const BACKENDS: readonly BackendDriver[] = [
  {
    kind: "deno-kv",
    harness: new URL("./kv/testing/harness.ts", import.meta.url).href,
  },
  {
    kind: "etcd",
    harness: new URL("./etcd/testing/harness.ts", import.meta.url).href,
  },
];

/** The driver of backend `kind`, or `undefined`. */
export function backendOfKind(kind: string): BackendDriver | undefined {
  return BACKENDS.find((b) => b.kind === kind);
}
