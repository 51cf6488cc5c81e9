/**
 * Opening the store named by `--store`/`--prefix` for one CLI run (through its backend's driver,
 * found in `src/backends/registry.ts` when the options were validated), and the read-only sessions commands read through. What an operator asks beyond the
 * allocator API (is anything stored here, which nodes hold leases, who references what) is the
 * backend's own admin surface, {@linkcode BackendAdmin}.
 *
 * @module
 */
import type { Backend, BackendAdmin, BackendSession, NodeLease } from "../allocator/backend.ts";
import type { GlobalOptions } from "./args.ts";
import { DoubleWriteBackend, type DoubleWriteMode } from "../backends/doublewrite/mod.ts";
import type { OpenedBackend } from "../backends/driver.ts";

/**
 * Opens the CRD side of a double-write mode beside the kvstore side `kvstore` and composes them;
 * the kvstore side alone in the other modes.
 */
async function openSides(
  options: GlobalOptions,
  kvstore: OpenedBackend,
  open: OpenStoreOptions,
): Promise<OpenedBackend> {
  if (options.crd === undefined) return kvstore;
  let crd: OpenedBackend;
  try {
    crd = await options.crd.driver.open(options.crd.description, { ...open, node: options.node });
  } catch (err) {
    await kvstore.close();
    throw err;
  }
  const mode = options.mode as DoubleWriteMode;
  return {
    backend: new DoubleWriteBackend({ mode, kvstore: kvstore.backend, crd: crd.backend }),
    where: `${mode}: ${kvstore.where} + ${crd.where}`,
    async close() {
      await Promise.allSettled([crd.close(), kvstore.close()]);
    },
  };
}

/** The store of one run. Close it after every allocator opened on its backend. */
export interface Store {
  /** The backend kind: `deno-kv`, `etcd`. */
  readonly kind: string;
  /** The store, for messages: `deno-kv ./ids.kv`, `etcd http://127.0.0.1:2379`. */
  readonly where: string;
  /** The prefix as the user types it. */
  readonly prefix: string;
  /** The backend, with this run's node name. */
  readonly backend: Backend;
  /** The backend's operator view. */
  readonly admin: BackendAdmin;
  /** Why the store is empty without asking it (no KV file there yet), if so. */
  readonly emptyBecause?: string;
  /** How often to look again for a store that is not there yet (`emptyBecause`), in ms. */
  readonly pollIntervalMs?: number;
  /**
   * When a node's lease stops counting as live for other nodes (ms since the epoch): its
   * `expiresAt`, plus the clock-skew margin on a store that judges leases by the nodes' clocks
   * (Deno KV's `--clock-skew`). `undefined` when the store cannot tell.
   */
  liveUntil(lease: NodeLease): number | undefined;
  /** A read-only session (no lease, no writes), closed with the store. */
  reader(signal: AbortSignal): Promise<BackendSession>;
  /** Closes sessions and the connection (etcd) or the Kv handle. */
  close(): Promise<void>;
}

/** Options of {@linkcode openStore}. */
export interface OpenStoreOptions {
  /** Create a new Deno KV file if none exists (only for commands that allocate). */
  readonly create: boolean;
  /** Aborts connecting: the user's interrupt or the `--timeout` deadline. */
  readonly signal: AbortSignal;
  /** The user's interrupt alone (see the driver's `DriverOpenOptions.interrupt`). */
  readonly interrupt?: AbortSignal;
}

/** Opens the store of `options`; throws `InvalidOptionsError` or `StoreUnavailableError`. */
export async function openStore(options: GlobalOptions, open: OpenStoreOptions): Promise<Store> {
  const { driver, description } = options.backend;
  const opened = await openSides(
    options,
    await driver.open(description, { ...open, node: options.node }),
    open,
  );
  const { backend } = opened;
  const admin = backend.admin();
  const sessions: BackendSession[] = [];
  // A description that names a clock-skew margin is of a store whose leases are judged by the
  // nodes' clocks: others count a lease live for that much longer than its own end.
  const skew = (description as { maxClockSkewMs?: unknown }).maxClockSkewMs;
  const marginMs = typeof skew === "number" ? skew : 0;
  return {
    kind: backend.kind,
    where: opened.where,
    prefix: admin.namespace,
    backend,
    admin,
    emptyBecause: opened.emptyBecause,
    pollIntervalMs: opened.pollIntervalMs,
    liveUntil: (lease) => lease.expiresAt === undefined ? undefined : lease.expiresAt + marginMs,
    async reader(signal: AbortSignal): Promise<BackendSession> {
      const session = await backend.openSession({
        leaseTtlMs: 60_000,
        readOnly: true,
        onLeaseReplaced: () => {},
        signal,
      });
      sessions.push(session);
      return session;
    },
    async close(): Promise<void> {
      await Promise.allSettled(sessions.map((s) => s.close()));
      await opened.close();
    },
  };
}
