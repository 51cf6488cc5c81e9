/**
 * What idalloc's tools (the CLI, the nemesis suite, the benchmarks and the shared test suites)
 * know of a backend: one driver per backend, in the backend's own folder, listed in
 * `./registry.ts`. A driver names its backend, describes a store of it (a zod schema, and how
 * `--store` and the backend's own CLI options make one), opens a store from that description,
 * and declares the damage kinds its doctor reports beyond the core ones.
 *
 * A driver module loads its backend's client only when it opens a store, so that listing the
 * drivers (the CLI does it on every run) costs no backend its startup time.
 *
 * @module
 */
import type { Backend } from "../allocator/backend.ts";
import type { z } from "../deps/zod.ts";

/**
 * One CLI option of a backend. It is accepted only with a store of that backend: given on the
 * command line with another backend's store it is a usage error (from the environment it is
 * ignored, as the environment serves every store).
 */
export interface StoreOption {
  /** Commander's flags: `--ca <file>`, `--poll <duration>`. */
  readonly flags: string;
  /** The help text, without the backend's name (the help groups options by backend). */
  readonly description: string;
  /** The value when the option is not given, as typed on the command line. */
  readonly default?: string;
  /** The environment variable that gives the value when the flag does not. */
  readonly env?: string;
  /**
   * The long flag without which a value from {@linkcode StoreOption.env} is not used (`--user`
   * for the password): an exported password must not break the commands that name no user.
   */
  readonly envOnlyWith?: string;
  /** Whether the value is a file name (shell completion then offers files). */
  readonly file?: boolean;
}

/** What a store is described with besides its backend's own options: the common CLI options. */
export interface StoreContext {
  /** `--prefix` as typed, or `undefined` for the backend's default namespace. */
  readonly prefix?: string;
  /** The deadline of reaching the store (`--timeout`), in ms. */
  readonly timeoutMs: number;
  /** The lease of the run's references (`--lease-ttl`), in ms. */
  readonly leaseTtlMs: number;
}

/** Options of {@linkcode BackendDriver.open}. */
export interface DriverOpenOptions {
  /** The node name of the run's references. */
  readonly node: string;
  /** Whether the store may be created (only runs that allocate may). */
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

/** A store opened by {@linkcode BackendDriver.open}. */
export interface OpenedBackend {
  /** The backend, with the run's node name. */
  readonly backend: Backend;
  /** The store, for messages: `deno-kv ./ids.kv`, `etcd http://127.0.0.1:2379`. */
  readonly where: string;
  /**
   * Why the store is known to be empty without asking it (e.g. no Deno KV file there yet), for
   * messages; undefined when the store itself answers.
   */
  readonly emptyBecause?: string;
  /** How often to look again for a store that is not there yet (see `emptyBecause`), in ms. */
  readonly pollIntervalMs?: number;
  /** Closes the connection or handle. */
  close(): Promise<void>;
}

/**
 * How tools report one of a backend's own error classes, told apart by its stable `name` (the
 * core classes of `src/errors.ts` need no such entry).
 */
export interface DriverFailure {
  /**
   * `usage`: a setup mistake that retrying cannot fix (credentials the store denies, TLS that
   * does not fit the server, an endpoint that is not this store); `unavailable`: the store
   * cannot be reached. Either names its cause, so it is reported even when the run's deadline
   * passes at the same time.
   */
  readonly kind: "usage" | "unavailable";
  /** What to do about `err`, in the CLI's flags; `""` when its message says it all. */
  readonly hint?: (err: unknown) => string;
}

/**
 * One backend as idalloc's tools know it. `D` is its store description: plain data (JSON-safe),
 * checked by {@linkcode BackendDriver.description}, that names one store completely, so that any
 * tool can open the same store from it.
 */
export interface BackendDriver<D = unknown> {
  /** The backend's one name, everywhere (`Backend.kind`, telemetry, CLI, nemesis, bench). */
  readonly kind: string;
  /**
   * The URL of the backend's folder (its driver module's folder). Development tools find the
   * backend's harness there (`testing/harness.ts`, which the package leaves out), so that the
   * registry is their one list of backends too.
   */
  readonly folder: string;
  /** The backend's name for people (help, messages): `Deno KV`, `etcd`. */
  readonly title: string;
  /** The start of `--store` that selects the backend: `kv:`, `etcd://`. */
  readonly scheme: string;
  /** How `--store` is written for it, for help and errors. */
  readonly syntax: string;
  /** A `--store` value that selects it, for examples and tests: `kv:./ids.kv`. */
  readonly exampleStore: string;
  /** How `--prefix` is written for it, and its default, for help. */
  readonly prefixSyntax: string;
  /** The backend's own CLI options, accepted only with its stores (see {@linkcode StoreOption}). */
  readonly options: readonly StoreOption[];
  /** The schema of the store description. */
  readonly description: z.ZodType<D>;
  /**
   * Damage kinds the backend's doctor reports besides `CORE_DAMAGE_KINDS` (its own entries, such
   * as Deno KV's counters or etcd's leases), each with what it means.
   */
  readonly damageKinds: Readonly<Record<string, string>>;
  /** The backend's own error classes, by `name`, as the CLI reports them. */
  readonly failures: Readonly<Record<string, DriverFailure>>;
  /** Whether the rest of `--store` after {@linkcode BackendDriver.scheme} is well-formed. */
  accepts(rest: string): boolean;
  /**
   * The store description of `--store <scheme><rest>` with the backend's option values (by
   * commander's attribute name: `tlsServerName` for `--tls-server-name`; absent when not given
   * and without a default). Throws `InvalidOptionsError` naming the flag for a bad value.
   */
  describe(rest: string, values: Readonly<Record<string, unknown>>, context: StoreContext): D;
  /**
   * Opens the store of `description`. Throws `InvalidOptionsError` for a store that cannot be
   * what it claims (a file that is not a Deno KV store), `StoreUnavailableError` (or a subclass)
   * for one that cannot be reached.
   */
  open(description: D, options: DriverOpenOptions): Promise<OpenedBackend>;
}
