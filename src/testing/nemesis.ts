/**
 * The nemesis suite's contract with a backend: what the orchestrator (`nemesis/`) does to and
 * reads from a store whatever the backend (parsed snapshots for the checks, garbage planted next
 * to valid data, a worker's lease revoked behind its back, entry counts for the growth run), and
 * the hooks each backend's harness (`src/backends/<folder>/testing/nemesis.ts`) gives: the faults
 * and garbage kinds it offers, its timings, how its store starts and how a child process opens it.
 * The nemesis lists faults and garbage kinds from what the registry's harnesses offer; nothing in
 * `nemesis/` knows one backend from another.
 *
 * @module
 */
import type { Backend } from "../allocator/backend.ts";
import type { StoreChange } from "./store_changes.ts";

/**
 * How a nemesis process reaches a store: the backend's kind, and whatever that backend's harness
 * needs (a file, endpoints, a prefix, timings), which its own schema checks when it opens the store.
 */
export interface NemesisStoreSpec {
  /** The backend's kind: the harness that opens the store. */
  readonly kind: string;
  /** The backend's own fields. */
  readonly [field: string]: unknown;
}

/** Allocator timings shared by every process of a nemesis run. */
export interface NemesisTimings {
  readonly leaseTtlMs: number;
  readonly syncIntervalMs: number;
  readonly gcIntervalMs: number;
  readonly callTimeoutMs: number;
}

/** What a backend's hooks see of the run's workload (`nemesis/workload.ts`). */
export interface NemesisWorkload {
  /** The workload's name (`--workload`). */
  readonly name: string;
  /** Allocator timings of every process of the run. */
  readonly timings: NemesisTimings;
  /**
   * Clock slack, ms, that the workers' backends allow a lease where they judge leases by the
   * clock (Deno KV: its harness makes it the backends' `maxClockSkewMs`).
   */
  readonly clockSkewMs: number;
  /** Whether real Cilium nodes join the run (`--cilium`): the store is set up for them. */
  readonly cilium?: boolean;
  /**
   * The run's seed (`--seed`), for a harness that draws a choice of its own for the whole run
   * (the double-write run's direction of migration).
   */
  readonly seed?: number;
}

/**
 * The faults the nemesis injects itself, on any backend that offers them: `kill` and `stall` act
 * on a worker's process, `lease-revoke` on its lease ({@linkcode NemesisStore.revokeLease}),
 * `garbage` plants the backend's garbage kinds ({@linkcode NemesisStore.plant}). A backend's own
 * faults on its store are {@linkcode NemesisHooks.storeFaults}.
 */
export const NEMESIS_FAULTS = ["kill", "stall", "lease-revoke", "garbage"] as const;

/** One of the faults the nemesis injects itself. */
export type NemesisFault = typeof NEMESIS_FAULTS[number];

/** A master as read. */
export interface SnapshotMaster {
  readonly id: number;
  readonly key: string;
}

/** A reference as read, with its liveness judged as the backend judges it. */
export interface SnapshotRef {
  readonly key: string;
  readonly node: string;
  readonly id: number;
  readonly live: boolean;
}

/** The parsed content of a store under the run's prefix, for the store checks. */
export interface StoreSnapshot {
  readonly at: number;
  readonly masters: readonly SnapshotMaster[];
  readonly refs: readonly SnapshotRef[];
  /** Deno KV's key index (key → ID); absent on etcd. */
  readonly index?: ReadonlyArray<{ readonly key: string; readonly id: number }>;
  /** Whether two masters of one key are a violation (Deno KV) or a collectable leftover (etcd). */
  readonly strictMasters: boolean;
  /** Entries that did not parse (garbage), by the reader's classification. */
  readonly skipped: Readonly<Record<string, number>>;
  /**
   * A store of several sides (double-write: the kvstore and the CRDs): each side's own snapshot by
   * the side's name, which the store checks judge one by one; the snapshot's own `masters` and
   * `refs` are then every side's together (what the drain waits to see gone).
   */
  readonly sides?: Readonly<Record<string, StoreSnapshot>>;
  /** Where the sides disagree, as the store's harness classifies it (only with `sides`). */
  readonly drift?: readonly SideDrift[];
}

/** One disagreement between the sides of a store, found in a {@linkcode StoreSnapshot}. */
export interface SideDrift {
  /** Its kind, in the harness's words (double-write: `kvstore-only`, `labels-differ`, …). */
  readonly kind: string;
  /**
   * Whether it breaks a promise when every writer is idalloc's (a label set with two IDs across
   * the sides, an ID with two label sets), rather than being a leftover the tools repair.
   */
  readonly broken: boolean;
  /** The IDs involved, for the report and for leaving planted garbage out. */
  readonly ids: readonly number[];
  /** What it is, in words. */
  readonly message: string;
}

/**
 * The store a worker's incarnation opens in a run whose nodes change their configuration as they
 * restart (a migration step's rolling restart): its spec, and the configuration's name for the
 * report.
 */
export interface NodeStoreSpec {
  /** How this incarnation reaches the store. */
  readonly spec: NemesisStoreSpec;
  /** Its configuration (double-write: the mode), which the report counts incarnations by. */
  readonly label: string;
}

/** What planting wrote, for the report. */
export interface Planted {
  /** The garbage kind. */
  readonly kind: string;
  /** The entries written, in a readable form. */
  readonly entries: readonly string[];
  /**
   * IDs of masters it wrote that parse as valid ones (each under {@linkcode OVERSIZED_KEY_PREFIX}):
   * garbage the checks must not count as data (see {@linkcode isPlantedMaster}).
   */
  readonly masterIds: readonly number[];
}

/** The key prefix of the only planted masters that parse: every harness's oversized key. */
export const OVERSIZED_KEY_PREFIX = "k8s:nemesis-oversized=";

/**
 * Whether master (or deleted master) `m` is planted garbage: planted at its ID **and** still the
 * planted key. Once GC collected the planted master, a real key may take the ID; that master is
 * data (the 30-minute mixed run, seed 42: ID 287 was k192's, ignored, and reported missing).
 */
export function isPlantedMaster(
  planted: ReadonlySet<number>,
  m: { readonly id: number; readonly key: string | null },
): boolean {
  return planted.has(m.id) && m.key !== null && m.key.startsWith(OVERSIZED_KEY_PREFIX);
}

/** Where planted garbage may point, drawn by the run with its seed. */
export interface GarbageTargets {
  /** A key of the run's families. */
  key(): string;
  /**
   * An ID in the plain workers' range (garbage there collides with valid IDs) or, half the time,
   * above it, where no worker allocates.
   */
  id(): number;
}

/** A store under test. */
export interface NemesisStore extends AsyncDisposable {
  /** The backend's kind (`BackendDriver.kind`). */
  readonly kind: string;
  /** How child processes reach it. */
  readonly spec: NemesisStoreSpec;
  /**
   * Clock slack the workers' backends allow a lease before judging it lapsed (a backend that
   * judges leases by the clock, e.g. Deno KV); 0 when the store ends leases itself (etcd).
   */
  readonly skewMs: number;
  /** Reads and parses everything under the prefix (garbage is counted, not returned). */
  snapshot(): Promise<StoreSnapshot>;
  /**
   * Plants garbage of `kind` (one of {@linkcode NemesisHooks.garbageKinds}), never overwriting an
   * entry that exists.
   */
  plant(kind: string, targets: GarbageTargets): Promise<Planted>;
  /**
   * Revokes `node`'s lease behind its back (etcd: the lease API; Deno KV: its lease record;
   * Kubernetes: its Lease deleted or its epoch changed); `random` is the run's, for a backend
   * with more than one way to do it.
   */
  revokeLease(node: string, random: () => number): Promise<string>;
  /**
   * Entries under the prefix by category, for the growth run (Deno KV adds `feed written`: the
   * change-feed entries ever written, from the store's own counter).
   */
  counts(): Promise<Record<string, number>>;
  /** Bytes of the store's files on disk, for the growth run (0 for a store without a file). */
  fileBytes(): Promise<number>;
}

/** What a store fault did, for the report. */
export interface StoreFaultOutcome {
  /** What exactly was done. */
  readonly detail: string;
  /**
   * When the store was whole again (every member healthy), for the recovery time; absent when
   * the fault left the store reachable throughout.
   */
  readonly backAt?: number;
}

/**
 * What Cilium nodes in CRD mode need of a run's Kubernetes store: a kubeconfig for Cilium's
 * clientset, the operator's heartbeat timeout the run uses (idalloc's nodes are told the same),
 * and the `CiliumEndpoint`s a real agent would write for what its node holds.
 */
export interface CiliumCrdSide {
  /** An admin kubeconfig file (its current context is the run's API server). */
  readonly kubeconfig: string;
  /** The operator's `--identity-heartbeat-timeout` in this run, ms. */
  readonly heartbeatTimeoutMs: number;
  /**
   * Node `node` uses key `key` as ID `id` (`undefined`: no longer): its `CiliumEndpoint` is
   * written (`status.identity.id`) or deleted in the background, retried through outages, in
   * the order asked.
   */
  setEndpoint(node: string, key: string, id: number | undefined): void;
  /** Resolves once every endpoint write asked so far is done (or given up after `timeoutMs`). */
  flushEndpoints(timeoutMs: number): Promise<void>;
}

/** The store of one backend run: where Cilium nodes join, and how its own faults are injected. */
export interface NemesisRunStore extends NemesisStore {
  /**
   * Where real Cilium nodes join the run (`--cilium`): endpoints and prefix of an etcd store.
   * Absent when the backend is not Cilium's kvstore.
   */
  readonly cilium?: { readonly endpoints: readonly string[]; readonly prefix: string };
  /**
   * Where real Cilium nodes in CRD mode join the run (`--cilium` on Kubernetes): Cilium's
   * `identity-allocation-mode=crd`. Absent when the store is no Kubernetes API server.
   */
  readonly ciliumCrd?: CiliumCrdSide;
  /**
   * Injects the store's own fault `kind` (one of {@linkcode NemesisHooks.storeFaults}) with the
   * run's seeded `random`, and resolves once it is over. The nemesis injects one at a time, even
   * when faults overlap.
   */
  injectFault?(kind: string, random: () => number): Promise<StoreFaultOutcome>;
  /**
   * Starts passing every change of a master, a reference or a Cilium mutex to `record`, in the
   * store's order (`store_changes.ts`): the evidence that attributes a violation beside Cilium
   * nodes. Resolves once nothing written after it can be missed; disposing it stops. Absent where
   * the store keeps no such order.
   */
  recordChanges?(record: (change: StoreChange) => void): Promise<AsyncDisposable>;
  /**
   * The store worker slot `slot` opens in its `generation`-th incarnation (0: as the run starts;
   * each restart after a kill is the next), for a run in which restarted nodes come back in
   * another configuration (a migration step). Absent: every process opens `spec`.
   */
  nodeSpec?(slot: number, generation: number): NodeStoreSpec;
}

/** A backend node's handle in a child process, and what closes it (a KV handle, a client). */
export interface OpenedBackend extends AsyncDisposable {
  readonly backend: Backend;
}

/** Options a child process passes when it opens a backend. */
export interface OpenBackendExtra {
  /** Change-feed retention of a backend that keeps a feed (Deno KV), short for the growth run. */
  readonly logRetentionMs?: number;
}

/** One sample of the growth run. */
export interface GrowthSample {
  readonly cycles: number;
  readonly elapsedMs: number;
  readonly rss: number;
  readonly heapUsed: number;
  /** Bytes of the store's files (Deno KV: the file and its WAL; 0 for a store without files). */
  readonly fileBytes: number;
  /** Entries under the prefix by category. */
  readonly counts: Record<string, number>;
  /**
   * Change-feed entries written since `logWindowMs` before this sample (Deno KV; 0 on etcd), or a
   * little more (counted from the last sample before the window): what the feed may hold.
   */
  readonly recentChanges: number;
  readonly logWindowMs: number;
}

/** The growth run's backend-specific bounds and table columns. */
export interface GrowthHooks {
  /**
   * Checks `sample`'s entry counts against bounds that grow with `keys` (the key set) and
   * `window` (keys held at once), and calls `fail` for each one broken.
   */
  check(
    sample: GrowthSample,
    bounds: { readonly keys: number; readonly window: number },
    fail: (what: string) => void,
  ): void;
  /** Table columns after `cycles`, `s`, `RSS MiB` and `heap MiB`. */
  readonly columns: readonly string[];
  /** One table row's cells for `columns`. */
  row(sample: GrowthSample): string[];
}

/** What the nemesis suite knows of one backend: one object in its harness. */
export interface NemesisHooks {
  /**
   * Why the nemesis cannot run on this backend although its tests can (its hooks are not built
   * yet), or `undefined` when it can; runs on it are skipped with that reason. Absent: it can.
   */
  unavailable?(): string | undefined;
  /** The nemesis's own faults ({@linkcode NEMESIS_FAULTS}) its runs take. */
  readonly faults: readonly NemesisFault[];
  /**
   * The store's own faults (etcd: members killed, compacted, cut off), kind → the report's label,
   * in the order `--faults` lists them; its run store injects them
   * ({@linkcode NemesisRunStore.injectFault}). Kinds are the backend's to name, but not the
   * nemesis's own, and two backends that offer one kind mean one thing by it.
   */
  readonly storeFaults?: Readonly<Record<string, string>>;
  /**
   * The garbage kinds its layout can hold (`--faults garbage/<kind>`), in the order `--faults`
   * lists them; its store plants them ({@linkcode NemesisStore.plant}).
   */
  readonly garbageKinds: readonly string[];
  /**
   * Seconds a run spends outside its fault phase (starting the store and the workers, settling,
   * probing, draining, checking): a fixed part, and a share of the run for the logs.
   */
  readonly overhead: { readonly fixed: number; readonly share: number };
  /**
   * Whether real Cilium nodes can join its runs (`--cilium`): the store is Cilium's kvstore
   * ({@linkcode NemesisRunStore.cilium}) or its CRDs ({@linkcode NemesisRunStore.ciliumCrd}).
   */
  readonly cilium: boolean;
  /** The workers' allocator timings under workload `name`, from the suite's `timings`. */
  timings(name: string, timings: NemesisTimings): NemesisTimings;
  /** Starts a fresh store for one run, its files under `dir`, tuned for `workload`. */
  startRun(dir: string, workload: NemesisWorkload): Promise<NemesisRunStore>;
  /**
   * Starts a fresh store for the growth run, its files under `dir`; `spec` is how the growth
   * worker reaches it. Disposing it stops the store.
   */
  startGrowth(dir: string): Promise<{ readonly spec: NemesisStoreSpec } & AsyncDisposable>;
  /** Opens the store `spec` names for reading and damage (the growth worker's counts). */
  openStore(spec: NemesisStoreSpec): Promise<NemesisStore>;
  /** Opens `node`'s backend on the store `spec` names, in a child process. */
  openBackend(
    spec: NemesisStoreSpec,
    node: string,
    extra?: OpenBackendExtra,
  ): Promise<OpenedBackend>;
  /** The growth run's bounds and table. */
  readonly growth: GrowthHooks;
}
