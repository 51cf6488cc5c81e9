/**
 * What the CLI needs to know of a backend: how `--store <scheme>…` names it and how to open it for
 * one run. Everything else (namespaces, leases, references) comes from the backend's own admin
 * surface, so a new backend adds one driver here and nothing else in the CLI.
 *
 * @module
 */
import type { Backend } from "../../allocator/backend.ts";
import type { GlobalOptions } from "../args.ts";

/** A backend opened for one CLI run. */
export interface OpenedBackend {
  /** The backend, with this run's node name. */
  readonly backend: Backend;
  /** The store, for messages: `deno-kv ./ids.kv`, `etcd http://127.0.0.1:2379`. */
  readonly where: string;
  /**
   * Why the store is known to be empty without asking it (e.g. no Deno KV file there yet), for
   * messages; undefined when the store itself answers.
   */
  readonly emptyBecause?: string;
  /** Closes the connection or handle. */
  close(): Promise<void>;
}

/** Options of {@linkcode StoreDriver.open}. */
export interface DriverOpenOptions {
  /** Whether the run may create the store (only commands that allocate). */
  readonly create: boolean;
  /** Aborts connecting: the user's interrupt or the `--timeout` deadline. */
  readonly signal: AbortSignal;
  /**
   * The user's interrupt alone. A driver with a connect timeout of its own (capped by
   * `--timeout`) connects under this, so that its failure names the cause even when it ends
   * together with `--timeout`.
   */
  readonly interrupt?: AbortSignal;
}

/** One backend as the CLI knows it. */
export interface StoreDriver {
  /** The start of `--store` that selects it: `kv:`, `etcd://`. */
  readonly scheme: string;
  /** How `--store` is written for it, for help and errors. */
  readonly syntax: string;
  /** Whether the rest of `--store` after the scheme is well-formed. */
  valid(rest: string): boolean;
  /** Opens it; throws `InvalidOptionsError` for bad options, `StoreUnavailableError` if down. */
  open(rest: string, options: GlobalOptions, open: DriverOpenOptions): Promise<OpenedBackend>;
}
