/**
 * `idalloc.identities`: how many identities an identity allocator knows, by scope — Cilium's
 * identity counts by type. Reported through the observable gauge while the allocator is open.
 *
 * @example A source that reports fixed counts
 * ```ts
 * import assert from "node:assert/strict";
 * import { IdentityCounts } from "./identity.ts";
 * let reads = 0;
 * const counts = new IdentityCounts({ backend: "deno-kv", prefix: "demo", node: "a" }, () => {
 *   reads++; // read only when a metric reader collects: nothing is counted ahead
 *   return { reserved: 20, global: 3, local: 1, remoteNode: 0, remoteClusters: [{ name: "c2", count: 4 }] };
 * });
 * counts.open();
 * counts.close();
 * assert.equal(reads, 0); // no SDK installed, so nothing collected
 * ```
 *
 * @module
 */
import { ATTR } from "./catalog.ts";
import type { AllocatorIdentity } from "./allocator.ts";
import { AttributeSets, type ObservationSink, observe } from "./instruments.ts";

/** Identities known, by scope. */
export interface IdentityScopeCounts {
  /** Reserved, well-known and user-reserved identities. */
  readonly reserved: number;
  /** This cluster's global identities in the cache. */
  readonly global: number;
  /** Node-local identities (CIDR, FQDN). */
  readonly local: number;
  /** Node-local identities in the remote-node scope. */
  readonly remoteNode: number;
  /** Remote clusters' identities, per cluster. */
  readonly remoteClusters: readonly { readonly name: string; readonly count: number }[];
}

/** Reports an identity allocator's counts while open. */
export class IdentityCounts {
  readonly #sets: AttributeSets;
  readonly #counts: () => IdentityScopeCounts;
  #registration: Disposable | undefined;

  /** @param identity the global allocator's backend, namespace and node @param counts the counts now */
  constructor(identity: AllocatorIdentity, counts: () => IdentityScopeCounts) {
    this.#sets = new AttributeSets({
      [ATTR.backend]: identity.backend,
      [ATTR.prefix]: identity.prefix,
      [ATTR.node]: identity.node,
    });
    this.#counts = counts;
  }

  /** Starts reporting. */
  open(): void {
    this.#registration = observe({ observe: (sink) => this.#observe(sink) });
  }

  /** Stops reporting. */
  close(): void {
    this.#registration?.[Symbol.dispose]();
    this.#registration = undefined;
  }

  #observe(sink: ObservationSink): void {
    const counts = this.#counts();
    const scoped = (scope: string) => this.#sets.get(scope, () => ({ [ATTR.scope]: scope }));
    sink.add("idalloc.identities", counts.reserved, scoped("reserved"));
    sink.add("idalloc.identities", counts.global, scoped("global"));
    sink.add("idalloc.identities", counts.local, scoped("local"));
    sink.add("idalloc.identities", counts.remoteNode, scoped("remote-node"));
    for (const { name, count } of counts.remoteClusters) {
      sink.add(
        "idalloc.identities",
        count,
        this.#sets.get(`remote\0${name}`, () => ({
          [ATTR.scope]: "remote-cluster",
          [ATTR.cluster]: name,
        })),
      );
    }
  }
}
