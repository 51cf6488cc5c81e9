/**
 * Loads backends' development harnesses (test fixture, nemesis hooks, bench opener) by kind, from
 * the registry: the repository's tests, nemesis suite and benchmarks find backends only here.
 * Not published (`deno.json` `publish.exclude`): a published module must not import it.
 *
 * @example
 * ```ts ignore
 * // ignored: needs the repository's harness modules, which are not published
 * const etcd = await loadHarness("etcd");
 * if (etcd.unavailable() === undefined) await using fx = await etcd.fixture.create();
 * ```
 * @module
 */
import type { BackendHarness } from "../../tests/_support/harness.ts";
import { backendOfKind, BACKENDS } from "./registry.ts";

/** A backend kind no driver in the registry has. */
export class UnknownBackendError extends Error {
  /** The kind asked for. */
  readonly kind: string;
  /** Creates the error for `kind`. */
  constructor(kind: string, options?: ErrorOptions) {
    super(`no backend of kind '${kind}' (have: ${backendKinds().join(", ")})`, options);
    this.name = "UnknownBackendError";
    this.kind = kind;
  }
}

/** A driver's harness module that does not load, or does not export its harness as `harness`. */
export class HarnessLoadError extends Error {
  /** The harness module's URL. */
  readonly module: string;
  /** Creates the error for `module`. */
  constructor(module: string, message: string, options?: ErrorOptions) {
    super(`${module}: ${message}`, options);
    this.name = "HarnessLoadError";
    this.module = module;
  }
}

/** Every backend kind, in the registry's order. */
export function backendKinds(): string[] {
  return BACKENDS.map((b) => b.kind);
}

const loaded = new Map<string, Promise<BackendHarness>>();

/** The harness of backend `kind`, loaded once per process. */
export function loadHarness(kind: string): Promise<BackendHarness> {
  let harness = loaded.get(kind);
  if (!harness) {
    const driver = backendOfKind(kind);
    if (!driver) return Promise.reject(new UnknownBackendError(kind));
    harness = importHarness(driver.kind, driver.harness);
    loaded.set(kind, harness);
  }
  return harness;
}

/** Every backend's harness, in the registry's order. */
export function loadHarnesses(): Promise<BackendHarness[]> {
  return Promise.all(BACKENDS.map((b) => loadHarness(b.kind)));
}

async function importHarness(kind: string, module: string): Promise<BackendHarness> {
  let exports: { harness?: BackendHarness };
  try {
    exports = await import(module);
  } catch (err) {
    throw new HarnessLoadError(module, `could not load the harness of ${kind}`, { cause: err });
  }
  const harness = exports.harness;
  if (harness === undefined || typeof harness !== "object") {
    throw new HarnessLoadError(module, "does not export `harness`");
  }
  if (harness.kind !== kind) {
    throw new HarnessLoadError(module, `its harness is of kind '${harness.kind}', not '${kind}'`);
  }
  return harness;
}
