/**
 * One remote cluster's identities (Cilium's `RemoteCache`): a read-only allocator on the remote
 * store, validated against the remote's range and cluster name, pumped into the change stream.
 *
 * @module
 */
import { Allocator } from "../allocator/allocator.ts";
import type { Backend } from "../allocator/backend.ts";
import { ClosedError } from "../errors.ts";
import { idallocLogger } from "../log.ts";
import type { ChangeHub } from "./changes.ts";
import { type Labels, labelsCodec } from "./labels.ts";
import { allocationRange, type MaxConnectedClusters } from "./numeric.ts";
import { allValidators, clusterIdValidator, clusterNameValidator } from "./validators.ts";

const log = idallocLogger("identity", "remote");

/** A remote cluster being watched. */
export class RemoteCluster {
  /** The remote cluster's name (its identities must carry it as their cluster label). */
  readonly name: string;
  /** The remote cluster's ID. */
  readonly clusterId: number;
  /** The read-only allocator on the remote store. */
  readonly allocator: Allocator<Labels>;
  /**
   * What this remote has put into the change stream, in stream order. Withdrawing the remote
   * deletes exactly these IDs, so no subscriber keeps an ID the stream added.
   */
  readonly published = new Map<number, Labels>();
  readonly #hub: ChangeHub;
  readonly #stop = new AbortController();
  readonly #synced = Promise.withResolvers<void>();
  #halted = false;
  #pump: Promise<void> | undefined;
  #closed: Promise<void> | undefined;
  /** Undone at close: listeners the owner put on its caller's signal. */
  readonly #cleanups: (() => void)[] = [];

  private constructor(
    name: string,
    clusterId: number,
    allocator: Allocator<Labels>,
    hub: ChangeHub,
  ) {
    this.name = name;
    this.clusterId = clusterId;
    this.allocator = allocator;
    this.#hub = hub;
    this.#synced.promise.catch(() => {});
  }

  /** Opens the read-only allocator and starts pumping its cache into `hub`. */
  static async open(
    name: string,
    clusterId: number,
    maxConnectedClusters: MaxConnectedClusters,
    backend: Backend,
    hub: ChangeHub,
    signal: AbortSignal,
  ): Promise<RemoteCluster> {
    const { min, max } = allocationRange(clusterId, maxConnectedClusters);
    const allocator = await Allocator.open<Labels>(backend, {
      min,
      max,
      codec: labelsCodec,
      readOnly: true,
      masterKeyProtection: false,
      validator: allValidators(
        clusterIdValidator(clusterId, maxConnectedClusters),
        clusterNameValidator(name),
      ),
    }, { signal });
    const remote = new RemoteCluster(name, clusterId, allocator, hub);
    remote.#pump = remote.#run();
    return remote;
  }

  /** Resolves when the remote's initial list is in the change stream. */
  get synced(): Promise<void> {
    return this.#synced.promise;
  }

  async #run(): Promise<void> {
    try {
      const signal = this.#stop.signal;
      for await (const event of this.allocator.watch({ signal })) {
        // Halting is synchronous, so nothing reaches the stream after the withdrawal's deletes.
        if (this.#halted) return;
        if (event.type === "upsert") {
          this.published.set(event.id, event.key);
          this.#hub.add(event.id, event.key);
        } else if (event.type === "delete") {
          this.published.delete(event.id);
          this.#hub.delete(event.id);
        } else {
          this.#synced.resolve();
        }
      }
      // Ended before (or after) the initial list: a waiter must not hang; no-op once resolved.
      this.#synced.reject(new ClosedError(`watch of remote cluster ${this.name}`));
    } catch (err) {
      if (!this.#halted) {
        log.warning("watch of remote cluster {name} failed: {err}", { name: this.name, err });
      }
      this.#synced.reject(err);
    }
  }

  /** Stops publishing at once (synchronously); `close()` then releases the resources. */
  halt(): void {
    this.#halted = true;
    this.#stop.abort();
  }

  /** Runs `cleanup` when the remote closes (at once if it already has). */
  onClose(cleanup: () => void): void {
    if (this.#closed) cleanup();
    else this.#cleanups.push(cleanup);
  }

  /** Halts and closes the allocator. Idempotent. */
  close(): Promise<void> {
    this.halt();
    for (const cleanup of this.#cleanups.splice(0)) cleanup();
    this.#closed ??= (async () => {
      await this.allocator.close();
      await this.#pump;
    })();
    return this.#closed;
  }
}
