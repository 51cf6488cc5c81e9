/**
 * The benchmarks' contract with a backend: what `bench/compare.ts`, `bench/scenario.ts`,
 * `bench/scale.ts` and `bench/runtimes.ts` do per backend, given by each backend's harness
 * (`src/backends/<folder>/testing/bench.ts`).
 *
 * @module
 */
import type { Backend } from "../allocator/backend.ts";

/** One cell of the side-by-side table: a scenario, its size and the backend options it runs with. */
export interface BenchCell {
  readonly name: string;
  readonly scenario: "raw" | "new" | "join" | "release" | "realloc" | "race";
  /** Operations (keys). */
  readonly count: number;
  /** Calls in flight. */
  readonly width: number;
  /**
   * Options of the measured node: the backend's (e.g. `groupCommit: false`), and the allocator's
   * `releaseInBackground`.
   */
  readonly options?: Record<string, unknown>;
  /** The raw cell this one is compared to. */
  readonly versus?: string;
}

/** The raw ceiling's writer: one create-if-absent commit per key, shaped like a new key's. */
export interface RawWriter extends AsyncDisposable {
  /** Commits key number `i`, whose name is `key`; throws if the commit did not apply. */
  write(i: number, key: string): Promise<void>;
}

/** A store the Node.js example runs on; disposing it stops or removes it. */
export interface ExampleStore extends AsyncDisposable {
  /** The example's arguments that select the store. */
  readonly args: readonly string[];
  /** The environment that names it. */
  readonly env: Readonly<Record<string, string>>;
}

/** How the Node.js example (`examples/node/main.ts`) runs on a backend, for `bench/runtimes.ts`. */
export interface ExampleHooks {
  /** A fresh store of the backend for one runtimes bench. */
  start(): Promise<ExampleStore>;
  /** Runtimes that cannot open the backend's store, each with why. */
  readonly unsupported?: Readonly<Partial<Record<"deno" | "node" | "bun", string>>>;
}

/** What the benchmarks know of one backend. */
export interface BenchHooks {
  /**
   * Cells only this backend has (etcd: new keys without the Cilium-mutex guard), placed after
   * the common new-key cells; `sizes` are the key counts of the sequential and the 16-in-flight
   * cells.
   */
  extraCells(sizes: { readonly sequential: number; readonly parallel: number }): BenchCell[];
  /**
   * A fresh store for one measurement; `where` is plain JSON that tells a child process how to
   * reach it. Disposing it removes the store.
   */
  fresh(): Promise<{ readonly where: unknown } & AsyncDisposable>;
  /** Opens `node`'s backend on the store `where` names, under `prefix`, with backend `options`. */
  open(
    where: unknown,
    prefix: string,
    node: string,
    options?: Record<string, unknown>,
  ): Promise<Backend & AsyncDisposable>;
  /** The raw ceiling's writer on the store `where` names, on one client. */
  raw(where: unknown): Promise<RawWriter>;
  /**
   * The address a real Cilium node (`../shared/cilium-node/`) reaches the store `where` names
   * at, for the side-by-side figures; absent for a backend Cilium cannot use.
   */
  ciliumPeer?(where: unknown): string;
  /** How the Node.js example runs on the backend; absent when the example has no such store. */
  readonly example?: ExampleHooks;
}
