/**
 * {@linkcode DoubleWriteBackend}: Cilium v1.17's double-write identity modes
 * (`doublewrite-readkvstore`, `doublewrite-readcrd`), for moving a cluster between its kvstore
 * (etcd) and CRDs (Kubernetes) without renumbering, composed of an etcd backend and a Kubernetes
 * backend through their public `Backend` interface alone (neither knows the other).
 *
 * **Cilium's order and rules** (`pkg/kvstore/allocator/doublewrite`):
 * - a new key: the `CiliumIdentity` first, then the kvstore master `id/<ID>` under the same ID;
 *   when the kvstore refuses it, the identity this attempt created is removed again;
 * - reads (`get`, `getById`, `watch`: Cilium's `Get`, `GetByID`, `ListAndWatch`) come from the
 *   side the mode names, whose answer is the key's ID;
 * - GC is the kvstore's (`RunGC`), deleting the CRD twin with the master (`DeleteID`); the lock is
 *   the kvstore's: every etcd write of idalloc is guarded by "no Cilium mutex on the key or ID",
 *   so Cilium's double-write agents (which create under that mutex) and idalloc go one at a time.
 *
 * **idalloc's guarantees, and why they hold:**
 * - *No two IDs for one key among idalloc nodes.* Each side's backend already gives a key at most
 *   one ID among idalloc nodes (etcd: guarded transactions; Kubernetes: the key claim). A new ID
 *   is decided on the CRD side and the kvstore is only ever asked for that same ID
 *   (`pickCandidate` offers it alone): the kvstore either takes it, answers it (another idalloc
 *   node did the same), or refuses; a refusal removes the CRD identity this attempt created and
 *   fails the attempt (`DoubleWriteConflictError`, retried), so no attempt leaves a key with one
 *   ID on one side and another on the other. In `readkvstore` an existing kvstore ID is the key's
 *   ID and the CRD is asked for it alone too. So idalloc nodes in one mode agree (they read one
 *   side, which holds one ID per key), and nodes in the two modes agree as long as every writer
 *   of either store double-writes (Cilium's precondition for the migration). What other writers
 *   made differ (drift) is never overwritten: the read side's ID is answered, the other side's is
 *   left, logged, and counted by `status` ({@linkcode identityDrift}).
 * - *Fencing.* `claimValidUntil()` is the earlier of the two sides': a node answers a held key from
 *   memory only while its references on both stores are provably alive, and a lapse on either
 *   side re-checks its keys (`ensure` on both sides, CRD first as Cilium's `UpdateKey`).
 * - *No tool deletes what a live node holds.* References are written on both sides (each under
 *   that side's lease), so each side's own GC, doctor and `release --node` see the node; this
 *   GC lists the kvstore's masters and deletes one only when **both** sides judge it unused —
 *   including Cilium's own users on the CRD side (`CiliumEndpoint`s, slices) — under each side's
 *   own guard (`./gc.ts`). The grace between marking and deleting defaults to the CRD side's
 *   (Cilium operator's heartbeat timeout, 30 min), the longer of the two.
 *
 * @example Compose the two backends (needs etcd and an API server: a function here)
 * ```ts
 * import { Allocator } from "@idalloc/idalloc";
 * import { EtcdBackend } from "@idalloc/idalloc/etcd";
 * import { K8sBackend } from "@idalloc/idalloc/k8s";
 * import { DoubleWriteBackend } from "./backend.ts";
 *
 * // Needs etcd and an API server: a function here, so that the doc tests type-check it without
 * // calling it.
 * async function migrate(): Promise<number> {
 *   await using kvstore = await EtcdBackend.connect({ endpoints: ["http://127.0.0.1:2379"], node: "n1" });
 *   await using crd = await K8sBackend.connect({ node: "n1", kubeconfig: "kubeconfig" });
 *   const backend = new DoubleWriteBackend({ mode: "doublewrite-readkvstore", kvstore, crd });
 *   await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *   return (await alloc.allocate("k8s:app=web;")).id;
 * }
 * ```
 *
 * @module
 */
import type {
  Backend,
  BackendAdmin,
  BackendSession,
  NodeLease,
  SessionOptions,
  StoredReference,
} from "../../allocator/backend.ts";
import type { DamageFinding, DamageScanOptions, StoreDoctor } from "../../allocator/damage.ts";
import { InvalidOptionsError } from "../../errors.ts";
import { ATTR } from "../../telemetry/catalog.ts";
import { AttributeSets } from "../../telemetry/instruments.ts";
import { bothDoctors, DriftRepairer, type DriftRepairOptions } from "./doctor.ts";
import { countDrift, type DriftCount } from "./drift.ts";
import { listMasters, withReaders } from "./masters.ts";
import type { DoubleWriteMode } from "./mode.ts";
import { isDoubleWrite, parseIdentityAllocationMode } from "./mode.ts";
import { DoubleWriteSession } from "./session.ts";

/** What {@linkcode DoubleWriteBackend} composes. */
export interface DoubleWriteOptions {
  /** `doublewrite-readkvstore` or `doublewrite-readcrd`. */
  readonly mode: DoubleWriteMode;
  /** The kvstore side: an etcd backend (`EtcdBackend`), in Cilium's kvstore layout. */
  readonly kvstore: Backend;
  /** The CRD side: a Kubernetes backend (`K8sBackend`), in Cilium's CRD layout. */
  readonly crd: Backend;
}

/** A store that writes identities to both Cilium stores. See the module documentation. */
export class DoubleWriteBackend implements Backend, StoreDoctor {
  /** The mode: `doublewrite-readkvstore` or `doublewrite-readcrd`. */
  readonly kind: DoubleWriteMode;
  /** This node's name (the same on both sides). */
  readonly node: string;
  /** The kvstore side. */
  readonly kvstore: Backend;
  /** The CRD side. */
  readonly crd: Backend;
  /** The longer of the two sides' default GC graces (the CRD side's: Cilium's heartbeat timeout). */
  readonly defaultGcGraceMs?: number;

  /**
   * Composes the two sides. Throws `InvalidOptionsError` for a mode that is not a double-write
   * mode or sides with different node names. The caller owns (and closes) both backends.
   */
  constructor(options: DoubleWriteOptions) {
    const mode = parseIdentityAllocationMode(options.mode);
    if (!isDoubleWrite(mode)) {
      throw new InvalidOptionsError(
        `a double-write backend needs mode doublewrite-readkvstore or doublewrite-readcrd, not ${mode}`,
      );
    }
    if (options.kvstore.node !== options.crd.node) {
      throw new InvalidOptionsError(
        `both sides must carry one node name; kvstore: '${options.kvstore.node}', crd: '${options.crd.node}'`,
      );
    }
    this.kind = mode;
    this.node = options.kvstore.node;
    this.kvstore = options.kvstore;
    this.crd = options.crd;
    const graces = [options.kvstore.defaultGcGraceMs, options.crd.defaultGcGraceMs]
      .filter((g) => g !== undefined);
    if (graces.length > 0) this.defaultGcGraceMs = Math.max(...graces);
  }

  /** Both sides must be able to store the key. */
  checkKey(key: string): void {
    this.kvstore.checkKey(key);
    this.crd.checkKey(key);
  }

  /**
   * Opens a session on each side (the CRD side's without the creation grace in its GC listing:
   * the grace is applied between this GC's passes, and a retracted identity must be removable at
   * once; live references and endpoints still count).
   */
  async openSession(options: SessionOptions): Promise<BackendSession> {
    const kvstore = await this.kvstore.openSession(options);
    try {
      const crd = await this.crd.openSession({ ...options, gcGraceMs: 0 });
      // A writable session reports the per-side counts (as Cilium's operator does) while open.
      const attributes = new AttributeSets({
        [ATTR.backend]: this.kind,
        [ATTR.prefix]: this.admin().namespace,
        [ATTR.node]: this.node,
      });
      return new DoubleWriteSession(this.kind, { kvstore, crd }, !options.readOnly, attributes);
    } catch (err) {
      await kvstore.close();
      throw err;
    }
  }

  /**
   * Each side's damage (its doctor's findings, the entry prefixed with the side), then the drift
   * between the sides: identities on one side only, IDs whose label sets differ, label sets
   * whose IDs differ (`./doctor.ts`). Reads only.
   */
  findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding> {
    return bothDoctors(this.#doctorSides()).findDamage(options);
  }

  /**
   * Removes a side's damaged entry through that side's doctor, or repairs a drift finding under
   * the stores' guards (see {@linkcode DriftRepairer.repair}; this opens and closes writable
   * sessions under this node's name for each call: {@linkcode DoubleWriteBackend.repairer} keeps
   * them for many).
   */
  removeDamage(
    finding: Pick<DamageFinding, "token">,
    options?: { readonly signal?: AbortSignal },
  ): Promise<boolean> {
    return bothDoctors(this.#doctorSides()).removeDamage(finding, options);
  }

  /** A repairer of drift findings whose writable sessions last until it is disposed. */
  repairer(options?: DriftRepairOptions): DriftRepairer {
    return new DriftRepairer(this.#doctorSides(), options);
  }

  #doctorSides() {
    return { mode: this.kind, kvstore: this.kvstore, crd: this.crd };
  }

  /** Both sides' operator views as one (see {@linkcode bothAdmins}). */
  admin(): BackendAdmin {
    return bothAdmins(this.kvstore.admin(), this.crd.admin());
  }
}

/**
 * Two admins as one: both namespaces, every node lease (live when live on either side), the
 * references of both sides (a key whose sides name different IDs shows as a split), and a
 * reference deleted on both sides (each refuses a live node's).
 */
export function bothAdmins(kvstore: BackendAdmin, crd: BackendAdmin): BackendAdmin {
  return {
    namespace: `${kvstore.namespace} + ${crd.namespace}`,
    async namespaceExists(signal) {
      const [a, b] = await Promise.all([
        kvstore.namespaceExists(signal),
        crd.namespaceExists(signal),
      ]);
      return a || b;
    },
    otherNamespaces: (signal, limit) => kvstore.otherNamespaces(signal, limit),
    async nodeLeases(signal) {
      const [a, b] = await Promise.all([kvstore.nodeLeases(signal), crd.nodeLeases(signal)]);
      const byNode = new Map<string, NodeLease>();
      for (const lease of [...a, ...b]) {
        const seen = byNode.get(lease.node);
        if (seen === undefined) {
          byNode.set(lease.node, lease);
          continue;
        }
        const ends = [seen.expiresAt, lease.expiresAt].filter((t) => t !== undefined);
        byNode.set(lease.node, {
          node: lease.node,
          live: seen.live || lease.live,
          ...(ends.length === 0 ? {} : { expiresAt: Math.max(...ends) }),
        });
      }
      return [...byNode.values()].sort((x, y) => (x.node < y.node ? -1 : x.node > y.node ? 1 : 0));
    },
    async *references(signal): AsyncIterable<StoredReference> {
      yield* kvstore.references(signal);
      yield* crd.references(signal);
    },
    async deleteReference(key, node, signal) {
      const a = await kvstore.deleteReference(key, node, signal);
      const b = await crd.deleteReference(key, node, signal);
      return a || b;
    },
  };
}

/**
 * The drift of `backend` when it is a {@linkcode DoubleWriteBackend} (read-only sessions on both
 * sides, closed before it returns), else `undefined`.
 */
export async function identityDrift(
  backend: Backend,
  signal: AbortSignal,
): Promise<DriftCount | undefined> {
  if (!(backend instanceof DoubleWriteBackend)) return undefined;
  return await withReaders(backend, signal, async (kv, crd) => {
    const [a, b] = await Promise.all([listMasters(kv, signal), listMasters(crd, signal)]);
    return countDrift(a, b);
  });
}
