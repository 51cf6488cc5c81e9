/**
 * The nemesis suite's contract with a backend: what the orchestrator does to and reads from a
 * store whatever the backend (parsed snapshots for the checks, garbage planted next to valid data,
 * a worker's lease revoked behind its back, entry counts for the growth run), and the hooks each
 * backend's harness (`src/backends/<folder>/testing/nemesis.ts`) gives: the faults it supports,
 * its timings, how its store starts and how a child process opens it. Nothing else in `nemesis/`
 * knows one backend from another.
 *
 * @module
 */
import type { Backend } from "../../src/allocator/backend.ts";
import type { StoreSnapshot } from "../checks/store.ts";
import type { FaultKind } from "../config.ts";
import type { GrowthSample } from "../growth_worker.ts";
import type { StoreSpec, Timings } from "../records.ts";
import type { Workload, WorkloadName } from "../workload.ts";

/** Garbage the suite plants under the prefix. Each kind is a fault of its own in the table. */
export const GARBAGE_KINDS = [
  "non-numeric-id",
  "empty-master",
  "bad-ref",
  "invalid-utf8",
  "oversized",
  "orphan-ref",
  "bad-index",
  "bad-counter",
] as const;

/** One kind of planted garbage. */
export type GarbageKind = typeof GARBAGE_KINDS[number];

/** What planting wrote, for the report. */
export interface Planted {
  readonly kind: GarbageKind;
  /** The entries written, in a readable form. */
  readonly entries: readonly string[];
  /** IDs of masters it wrote that parse as valid ones: garbage the checks must not count as data. */
  readonly masterIds: readonly number[];
}

/** Where planted garbage may point: the key families and the ranges the workers use. */
export interface GarbageTargets {
  readonly keys: readonly string[];
  /** IDs the plain workers allocate from: garbage here collides with valid IDs. */
  readonly range: { readonly min: number; readonly max: number };
  readonly random: () => number;
}

/** A store under test. */
export interface NemesisStore extends AsyncDisposable {
  /** The backend's kind (`BackendDriver.kind`). */
  readonly kind: string;
  /** How child processes reach it. */
  readonly spec: StoreSpec;
  /** Garbage kinds this backend can hold. */
  readonly garbageKinds: readonly GarbageKind[];
  /**
   * Clock slack the workers' backends allow a lease before judging it lapsed (a backend that
   * judges leases by the clock, e.g. Deno KV); 0 when the store ends leases itself (etcd).
   */
  readonly skewMs: number;
  /** Reads and parses everything under the prefix (garbage is counted, not returned). */
  snapshot(): Promise<StoreSnapshot>;
  /** Plants one kind of garbage, never overwriting an entry that exists. */
  plant(kind: GarbageKind, targets: GarbageTargets): Promise<Planted>;
  /** Revokes `node`'s lease behind its back (etcd: the lease API; Deno KV: its lease record). */
  revokeLease(node: string): Promise<string>;
  /**
   * Entries under the prefix by category, for the growth run (Deno KV adds `feed written`: the
   * change-feed entries ever written, from the store's own counter).
   */
  counts(): Promise<Record<string, number>>;
  /** Bytes of the store's files on disk, for the growth run (0 for a store without a file). */
  fileBytes(): Promise<number>;
}

/**
 * The members of a replicated store (etcd's cluster), for the faults that act on them: a store
 * without members supports none of those.
 */
export interface StoreMembers {
  /** One client endpoint per member: the count of members. */
  readonly endpoints: readonly string[];
  /** SIGKILLs member `index` and waits until it is gone. */
  kill(index: number): Promise<void>;
  /** Starts a killed member again and waits until it is healthy. */
  restart(index: number): Promise<void>;
  /** Index of the current leader (waits for one). */
  leader(): Promise<number>;
  /** Compacts the store's history up to its current revision; returns the revision. */
  compact(): Promise<number>;
}

/** The store of one backend run: its members when it has some, and where Cilium nodes join. */
export interface NemesisRunStore extends NemesisStore {
  /** The store's members (faults on them need these); absent for a single file. */
  readonly members?: StoreMembers;
  /**
   * Where real Cilium nodes join the run (`--cilium`): endpoints and prefix of an etcd store.
   * Absent when the backend is not Cilium's kvstore.
   */
  readonly cilium?: { readonly endpoints: readonly string[]; readonly prefix: string };
  /**
   * Starts recording every change of a master, a reference or a Cilium mutex, in the store's
   * order, as JSON lines in `path` (`nemesis/checks/store_history.ts`): the evidence that
   * attributes a violation beside Cilium nodes. Absent where the store keeps no such order.
   */
  recordChanges?(path: string): Promise<AsyncDisposable>;
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
  /** Every fault kind the backend supports (faults on store members need a store that has them). */
  readonly faults: readonly FaultKind[];
  /** Garbage kinds its layout can hold. */
  readonly garbageKinds: readonly GarbageKind[];
  /**
   * Seconds a run spends outside its fault phase (starting the store and the workers, settling,
   * probing, draining, checking): a fixed part, and a share of the run for the logs.
   */
  readonly overhead: { readonly fixed: number; readonly share: number };
  /** Whether real Cilium nodes can join its runs (`--cilium`: the store is Cilium's kvstore). */
  readonly cilium: boolean;
  /** The workers' allocator timings under workload `name`, from the suite's `timings`. */
  timings(name: WorkloadName, timings: Timings): Timings;
  /** Starts a fresh store for one run, its files under `dir`, tuned for `workload`. */
  startRun(dir: string, workload: Workload): Promise<NemesisRunStore>;
  /**
   * Starts a fresh store for the growth run, its files under `dir`; `spec` is how the growth
   * worker reaches it. Disposing it stops the store.
   */
  startGrowth(dir: string): Promise<{ readonly spec: StoreSpec } & AsyncDisposable>;
  /** Opens the store `spec` names for reading and damage (the growth worker's counts). */
  openStore(spec: StoreSpec): Promise<NemesisStore>;
  /** Opens `node`'s backend on the store `spec` names, in a child process. */
  openBackend(spec: StoreSpec, node: string, extra?: OpenBackendExtra): Promise<OpenedBackend>;
  /** The growth run's bounds and table. */
  readonly growth: GrowthHooks;
}

/** A random ID in `range`, or (half the time) above it, where no worker allocates. */
export function garbageId(targets: GarbageTargets): number {
  const { min, max } = targets.range;
  return targets.random() < 0.5
    ? min + Math.floor(targets.random() * (max - min + 1))
    : max + 100_000 + Math.floor(targets.random() * 100_000);
}

/** A key of the families, picked with the targets' randomness. */
export function garbageKey(targets: GarbageTargets): string {
  return targets.keys[Math.floor(targets.random() * targets.keys.length)];
}
