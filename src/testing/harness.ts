/**
 * The loader of the backends' development harnesses: everything the repository's tests, nemesis
 * suite, benchmarks and examples need of one backend, in one object
 * ({@linkcode BackendHarness}), found by kind. Each backend exports it as `harness` from
 * `testing/harness.ts` in its folder, which its driver in the backend registry names
 * (`BackendDriver.folder`): the registry is the one list of backends, this module names none, and
 * no published module names a harness.
 *
 * `src/testing/` is development-only (`deno.json` `publish.exclude`): the contracts the harnesses
 * meet live here (`harness_contract.ts`, `fixture.ts`, `nemesis.ts`, `bench.ts`), beside the
 * library, so that the dependencies point one way — the harnesses import the library and the
 * contracts, never this loader, and the loader reaches them only through the registry.
 *
 * @example
 * ```ts ignore
 * // ignored: loads the backends' harness modules, which start stores.
 * const etcd = await loadHarness("etcd");
 * if (etcd.unavailable() === undefined) await using fx = await etcd.fixture.create();
 * ```
 * @module
 */
import { backendOfKind, BACKENDS } from "../backends/registry.ts";
import type { BackendHarness } from "./harness_contract.ts";

export type { BackendHarness, PrivateServer } from "./harness_contract.ts";

/** Where a backend's harness module lives, in the folder its driver names. */
const HARNESS_PATH = "testing/harness.ts";

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

/** A backend's harness that does not load, is not of the backend's kind, or breaks its contract. */
export class HarnessLoadError extends Error {
  /** The backend's kind. */
  readonly kind: string;
  /** Creates the error for the harness of `kind`. */
  constructor(kind: string, message: string, options?: ErrorOptions) {
    super(`harness of ${kind}: ${message}`, options);
    this.name = "HarnessLoadError";
    this.kind = kind;
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
    if (!backendOfKind(kind)) return Promise.reject(new UnknownBackendError(kind));
    harness = importHarness(kind);
    loaded.set(kind, harness);
  }
  return harness;
}

/** Every backend's harness, in the registry's order. */
export function loadHarnesses(): Promise<BackendHarness[]> {
  return Promise.all(BACKENDS.map((b) => loadHarness(b.kind)));
}

/** The URL of the harness module of backend `kind` (its driver's folder, see the module doc). */
export function harnessModule(kind: string): string {
  const driver = backendOfKind(kind);
  if (driver === undefined) throw new UnknownBackendError(kind);
  return new URL(HARNESS_PATH, driver.folder).href;
}

async function importHarness(kind: string): Promise<BackendHarness> {
  const url = harnessModule(kind);
  let harness: BackendHarness | undefined;
  try {
    ({ harness } = await import(url) as { harness?: BackendHarness });
  } catch (err) {
    throw new HarnessLoadError(kind, `its module ${url} does not load`, { cause: err });
  }
  if (harness === undefined) {
    throw new HarnessLoadError(kind, `its module ${url} exports no harness`);
  }
  if (harness.kind !== kind) {
    throw new HarnessLoadError(kind, `its module's harness is of kind '${harness.kind}'`);
  }
  return harness;
}
