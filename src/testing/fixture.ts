/**
 * The shared test suites' contract with a backend: one factory per backend. A new backend gets the
 * whole suite — conformance, identity, CLI and the child-process scenarios — by giving its
 * `BackendFactory` as the `fixture` of its harness (`src/backends/<folder>/testing/harness.ts`);
 * `tests/_support/factories.ts` finds it through the harness loader (`./harness.ts`).
 *
 * @module
 */
import type { Backend } from "../allocator/backend.ts";

/** Options of a whole fixture: they apply to every backend it makes, children's included. */
export interface FixtureOptions {
  /** The backends' group commit (`groupCommit` of either backend). @default {true} */
  readonly groupCommit?: boolean;
}

/** Options for a node's backend in a fixture. */
export interface NodeBackendOptions {
  /** Overrides for the backend's own timing knobs (poll intervals etc.), backend-specific. */
  readonly fast?: boolean;
}

/**
 * What a child process needs to open the same store: plain JSON naming the backend's kind, whose
 * harness's fixture opens it ({@linkcode BackendFactory.openFromSpec}), so children need no list
 * of backends.
 */
export interface StoreSpec {
  /** Backend kind: the registry finds the harness that opens the store. */
  readonly kind: string;
  /** What that module needs (a file path, endpoints, a prefix…). */
  readonly store: unknown;
  /** `--store`/`--prefix` arguments that name this store on the CLI's command line. */
  readonly cli: readonly string[];
}

/** A fixture's opener of a {@linkcode StoreSpec}, run in child processes. */
export type OpenFromSpec = (
  spec: StoreSpec,
  node: string,
  options?: NodeBackendOptions,
) => Promise<{ backend: Backend } & AsyncDisposable>;

/** A reference as stored, for invariant checks. */
export interface StoredReference {
  readonly key: string;
  readonly node: string;
  readonly id: number;
  /** Whether its lease is alive now. */
  readonly live: boolean;
}

/** One isolated namespace of a real store (a fresh KV file, or a fresh prefix on a private etcd). */
export interface StoreFixture extends AsyncDisposable {
  /** Backend kind. */
  readonly kind: string;
  /** A backend for node `node` on this namespace. Closed with the fixture. */
  backend(node: string, options?: NodeBackendOptions): Promise<Backend>;
  /** JSON a child process passes to `openBackendFromSpec` to reach the same namespace. */
  spec(): StoreSpec;
  /** Every master in the store: ID → encoded key (read directly, bypassing any allocator). */
  masters(): Promise<Map<number, string>>;
  /** Every reference in the store. */
  references(): Promise<StoredReference[]>;
  /**
   * Writes node `node`'s live reference of `key` naming `id` directly, bypassing every guard (a
   * split another writer made, for operator tools to find).
   */
  plantReference(key: string, node: string, id: number): Promise<void>;
  /**
   * Writes an unreadable reference of node `node` to `key` as if under its lease (etcd: bound to
   * the lease of the node's existing references; Deno KV: `node` names it), for operator tools
   * that must not delete what a live node holds.
   */
  plantCorruptReference(key: string, node: string): Promise<void>;
  /** Writes garbage under the namespace (a master with a non-numeric ID, a master with a bad value, a bad reference). */
  plantCorruptEntries(): Promise<void>;
  /**
   * Writes master `id` whose key is too large for the layout (Deno KV: a 60 kB key; etcd: a
   * 1.4 MB value), as a broken tool would.
   */
  plantOversizedMaster(id: number): Promise<void>;
  /**
   * Overwrites master `id` with a value that cannot be decoded (Deno KV: a string instead of
   * `{ key }`; etcd: bytes that are not UTF-8).
   */
  corruptMaster(id: number): Promise<void>;
  /**
   * Writes a string over a counter: `gen`, or the touch entry of a key. Only for backends that
   * keep counters (Deno KV); absent otherwise.
   */
  corruptCounter?(counter: "gen" | { readonly touch: string }): Promise<void>;
  /** Deletes master `id` directly (an operator's mistake, store loss). */
  deleteMaster(id: number): Promise<void>;
  /**
   * Rewrites master `id` to name `key` directly, as a writer that ignores the protocol could:
   * from then on the store gives the ID to `key` (watchers see the change).
   */
  rewriteMaster(id: number, key: string): Promise<void>;
  /**
   * Makes node `node`'s lease vanish, as an expiry the node missed or an operator's revoke would:
   * its references are dead from then on.
   */
  dropLease(node: string): Promise<void>;
  /** Deletes node `node`'s reference to `key` directly. */
  deleteReference(key: string, node: string): Promise<void>;
}

/**
 * How a backend's store behaves where the shared suites' expectations differ by backend. The
 * suites read these instead of testing the kind, so a new backend states its own.
 */
export interface BackendTraits {
  /**
   * Whether the store keeps counters (Deno KV's `gen` and touch entries), which
   * {@linkcode StoreFixture.corruptCounter} can damage.
   */
  readonly counters: boolean;
  /**
   * Whether the backend batches writes (group commit) that `FixtureOptions.groupCommit` turns
   * off, so that the conformance scenarios run once more with it off.
   */
  readonly groupCommit: boolean;
  /**
   * Whether GC marks unused IDs in the store and a node removes the mark from what it holds as
   * soon as its watch shows it (Kubernetes: Cilium's heartbeat annotation), so that a holder
   * unaware of its lapsed lease races GC passes that ignore the grace.
   */
  readonly holdersUnmark: boolean;
  /** The shortest lease the backend grants, in ms (etcd: whole seconds, at least 2). */
  readonly minLeaseTtlMs: number;
  /**
   * Whether a dead node's references stay in the store until GC sweeps them (Deno KV), rather
   * than going with its lease (etcd).
   */
  readonly deadReferencesStay: boolean;
  /**
   * Damage kinds beyond the core ones that {@linkcode StoreFixture.plantCorruptEntries} makes
   * the doctor report.
   */
  readonly plantedDamageKinds: readonly string[];
  /**
   * Entries of {@linkcode StoreFixture.plantCorruptEntries}'s damage that removing the other
   * findings repairs first, so that their own listed removal is then refused (Deno KV: `gen`,
   * repaired by the change-feed entry a removal writes).
   */
  readonly repairedByRemoval: readonly string[];
}

/** Makes fixtures of one backend kind. */
export interface BackendFactory {
  /** Backend kind, used in test names. */
  readonly kind: string;
  /** How the backend's store behaves where the shared suites' expectations differ. */
  readonly traits: BackendTraits;
  /** Undefined when the backend can run here; otherwise why not (e.g. no etcd on PATH). */
  readonly unavailable?: string;
  /** A fresh isolated namespace. */
  create(options?: FixtureOptions): Promise<StoreFixture>;
  /** Opens a node's backend on the store a {@linkcode StoreSpec} of this kind names. */
  readonly openFromSpec: OpenFromSpec;
}
