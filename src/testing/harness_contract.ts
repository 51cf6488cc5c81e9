/**
 * What a backend's development harness provides ({@linkcode BackendHarness}): the contract between
 * the harness modules (`src/backends/<folder>/testing/harness.ts`) and the loader
 * (`src/testing/harness.ts`) that finds them through the backend registry. Both import it; the
 * harnesses never import the loader, so the two do not depend on each other in a circle.
 * Development-only, like the rest of `src/testing/`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import type { BackendHarness } from "./harness_contract.ts";
 *
 * // A harness says why its backend cannot run here, or undefined when it can.
 * const why = (h: Pick<BackendHarness, "unavailable">) => h.unavailable() ?? "available";
 * assert.equal(why({ unavailable: () => undefined }), "available");
 * assert.equal(why({ unavailable: () => "no etcd binary" }), "no etcd binary");
 * ```
 *
 * @module
 */
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
 * The harness of a store composed of the registry's backends (the double-write store: etcd and
 * Kubernetes side by side), which no `--store` scheme names and only the nemesis runs: its kind,
 * why it cannot run here, and its nemesis hooks. Its tests compose the sides' fixtures themselves.
 */
export type ComposedHarness = Pick<BackendHarness, "kind" | "unavailable" | "nemesis">;
