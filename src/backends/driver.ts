/**
 * What idalloc's tools (the CLI, the nemesis suite, the benchmarks and the shared test suites)
 * know of a backend: one driver per backend, in the backend's own folder, listed in
 * `./registry.ts`.
 *
 * @module
 */

/** One backend as idalloc's tools know it. */
export interface BackendDriver {
  /** The backend's one name, everywhere (`Backend.kind`, telemetry, CLI, nemesis, bench). */
  readonly kind: string;
  /**
   * URL of the backend's development harness module (`testing/harness.ts` in its folder: test
   * fixture, nemesis hooks, bench opener). Not published; loaded only by the repository's tests,
   * nemesis suite and benchmarks, through `src/backends/testing.ts`.
   */
  readonly harness: string;
}
