/**
 * Every backend idalloc's tools can use. A new backend adds its driver here (and its exports to
 * `deno.json`); the CLI, the nemesis suite, the benchmarks and the shared test suites find
 * backends only through this list.
 *
 * @module
 */
import type { BackendDriver } from "./driver.ts";
import { etcdDriver } from "./etcd/driver.ts";
import { k8sDriver } from "./k8s/driver.ts";
import { kvDriver } from "./kv/driver.ts";

/** Every backend, in the order tools list them. */
export const BACKENDS: readonly BackendDriver[] = [kvDriver, etcdDriver, k8sDriver];

/** The driver of backend `kind`, or `undefined`. */
export function backendOfKind(kind: string): BackendDriver | undefined {
  return BACKENDS.find((b) => b.kind === kind);
}

/** A `--store` value split into its backend and the rest after the backend's scheme. */
export interface SelectedStore {
  /** The backend whose scheme starts the value. */
  readonly driver: BackendDriver;
  /** The value without the scheme: `./ids.kv`, `127.0.0.1:2379`. */
  readonly rest: string;
}

/** The backend of a `--store` value, or `undefined` when no backend accepts it. */
export function backendOfStore(store: string): SelectedStore | undefined {
  for (const driver of BACKENDS) {
    if (!store.startsWith(driver.scheme)) continue;
    const rest = store.slice(driver.scheme.length);
    return driver.accepts(rest) ? { driver, rest } : undefined;
  }
  return undefined;
}

/** How `--store` may be written, for help and messages. */
export function storeSyntax(): string {
  return BACKENDS.map((d) => d.syntax).join(" or ");
}
