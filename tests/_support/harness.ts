/**
 * The development harness of one backend: everything the repository's tests, nemesis suite and
 * benchmarks need of it, in one object. Each backend exports it as `harness` from
 * `src/backends/<folder>/testing/harness.ts` (the module its `BackendDriver.harness` names), and
 * `src/backends/testing.ts` loads it by kind: no test, nemesis or bench module lists backends.
 *
 * @example A harness module
 * ```ts ignore
 * // Type-checked in the backends' own harness modules; shown here for its shape.
 * export const harness = {
 *   kind: "deno-kv",
 *   unavailable: () => undefined,
 *   fixture: kvFactory,
 *   nemesis: kvNemesis,
 *   bench: kvBench,
 * } satisfies BackendHarness;
 * ```
 * @module
 */
import type { BenchHooks } from "../../bench/backend.ts";
import type { NemesisHooks } from "../../nemesis/stores/store.ts";
import type { BackendFactory } from "./fixture.ts";

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
  /** What the cold-process benchmarks (`bench/compare.ts`, `bench/scenario.ts`) do per backend. */
  readonly bench: BenchHooks;
}
