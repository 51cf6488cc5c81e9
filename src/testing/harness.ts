/**
 * The development harness of a backend, and its loader: everything the repository's tests, nemesis
 * suite, benchmarks and examples need of one backend, in one object, found by kind. Each backend
 * exports it as `harness` from `src/backends/<folder>/testing/harness.ts`; the tests, nemesis and
 * bench load it from here ({@linkcode loadHarness}), so none of them lists backends, and no
 * published module names a harness.
 *
 * `src/testing/` is development-only (`deno.json` `publish.exclude`): the contracts the harnesses
 * meet live here (`fixture.ts`, `nemesis.ts`, `bench.ts`), beside the library, so that the
 * dependencies point one way — the harnesses import the library, never the reverse.
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
import type { BenchHooks } from "./bench.ts";
import type { BackendFactory } from "./fixture.ts";
import type { NemesisHooks } from "./nemesis.ts";

/** A private server of a backend's store on loopback, for examples; disposing it stops it. */
export interface PrivateServer extends AsyncDisposable {
  /** Its client URLs (`http://127.0.0.1:<port>`), one per member. */
  readonly endpoints: readonly string[];
  /**
   * A kubeconfig file naming the server and an administrator's credentials, for a store reached
   * through one (Kubernetes); its current context is the one to use.
   */
  readonly kubeconfig?: string;
  /** Stops it and removes its data. */
  close(): Promise<void>;
}

/** One backend's test fixture, nemesis hooks and bench opener. */
export interface BackendHarness {
  /** The backend's kind: the same as its `BackendDriver.kind`. */
  readonly kind: string;
  /**
   * Why the backend cannot run on this machine (e.g. no etcd binary), or `undefined` when it can.
   * Tests skip it with that reason; nemesis and bench runs say so and skip it.
   */
  unavailable(): string | undefined;
  /** The shared suites' fixture factory (conformance, identity, CLI, child-process scenarios). */
  readonly fixture: BackendFactory;
  /** What the nemesis suite does per backend. */
  readonly nemesis: NemesisHooks;
  /** What the benchmarks do per backend. */
  readonly bench: BenchHooks;
  /**
   * Starts a private server of the store (etcd: one member on free loopback ports), for examples
   * run without a store of the user's; `undefined` when none can start here (no etcd binary).
   * Absent for a store that is a file.
   */
  server?(): Promise<PrivateServer | undefined>;
}

/**
 * Each backend kind's harness module, imported on first use. A new backend adds its line here,
 * beside its driver's in `src/backends/registry.ts` (a test keeps the two lists equal).
 */
export const HARNESS_MODULES: Readonly<
  Record<string, () => Promise<{ readonly harness: BackendHarness }>>
> = {
  "deno-kv": () => import("../backends/kv/testing/harness.ts"),
  "etcd": () => import("../backends/etcd/testing/harness.ts"),
  "k8s": () => import("../backends/k8s/testing/harness.ts"),
};

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

async function importHarness(kind: string): Promise<BackendHarness> {
  const load = HARNESS_MODULES[kind];
  if (load === undefined) {
    throw new HarnessLoadError(kind, "no module in HARNESS_MODULES (src/testing/harness.ts)");
  }
  let harness: BackendHarness;
  try {
    ({ harness } = await load());
  } catch (err) {
    throw new HarnessLoadError(kind, "its module does not load", { cause: err });
  }
  if (harness.kind !== kind) {
    throw new HarnessLoadError(kind, `its module's harness is of kind '${harness.kind}'`);
  }
  return harness;
}
