/**
 * A nemesis run's Kubernetes store: Cilium's `ciliumidentities` on the run's private API server,
 * with the node Leases and key claims in one namespace, read through the backend's layout
 * (`./nemesis_read.ts`), damaged by `./nemesis_garbage.ts`, faulted by `./nemesis_faults.ts`.
 *
 * A lease is revoked by an outsider in two ways, drawn with the run's seed: the node's Lease
 * deleted (its next renewal finds it gone and takes a new epoch), or its epoch changed (its
 * renewal finds the Lease under another live epoch, stays fenced until that lapses, then takes a
 * new one). Either way every reference of the old epoch is dead for everyone at once.
 *
 * @module
 */
import { copyFile } from "node:fs/promises";
import { join } from "node:path";
import { z } from "../../../deps/zod.ts";
import type {
  CiliumCrdSide,
  GarbageTargets,
  NemesisRunStore,
  NemesisStoreSpec,
  Planted,
  StoreFaultOutcome,
  StoreSnapshot,
} from "../../../testing/nemesis.ts";
import type { StoreChange } from "../../../testing/store_changes.ts";
import type { KubeClient, KubeObject, KubeResourceDescriptor } from "../client.ts";
import { isStatus } from "../kube.ts";
import {
  CLAIM_SELECTOR,
  EPOCH_ANNOTATION,
  NODE_SELECTOR,
  nodeLeaseName,
  REFS_SELECTOR,
} from "../layout.ts";
import { LEASES } from "../options.ts";
import { listAll } from "../paging.ts";
import { identityResource, type KubeTestCluster } from "./cluster.ts";
import { EndpointWriter, recordK8sChanges } from "./nemesis_cilium.ts";
import { injectK8sFault, reviveApiServer } from "./nemesis_faults.ts";
import { sleep } from "../../../abort.ts";
import { plantK8s } from "./nemesis_garbage.ts";
import { k8sCounts, k8sSnapshot } from "./nemesis_read.ts";
import { HARNESS_RETRY_MS, retryingClient, untilServed } from "./nemesis_retry.ts";

/** How a nemesis process reaches a Kubernetes store. */
const k8sSpecSchema = z.object({
  kind: z.literal("k8s"),
  /** An admin kubeconfig. */
  kubeconfig: z.string().min(1),
  /** Its context to use. */
  context: z.string().min(1),
  /** The namespace of the node Leases and key claims. */
  namespace: z.string().min(1),
  /** The identity resource's group (`cilium.io`). */
  group: z.string().min(1),
  /** The workers' clock-skew margin. */
  maxClockSkewMs: z.number().int().nonnegative(),
  /** The workers' request timeout. */
  requestTimeoutMs: z.number().int().positive(),
  /**
   * Cilium operator's heartbeat timeout the workers are told (beside Cilium CRD-mode nodes the
   * run's own operator uses it too); absent: the backend's default.
   */
  heartbeatTimeoutMs: z.number().int().positive().optional(),
});

/** How a nemesis process reaches a Kubernetes store. */
export type K8sNemesisSpec = z.infer<typeof k8sSpecSchema>;

/** `spec` as this backend's; throws a `ZodError` when it is another's or malformed. */
export function k8sSpec(spec: NemesisStoreSpec): K8sNemesisSpec {
  return k8sSpecSchema.parse(spec);
}

/**
 * The signal of one attempt of a harness list: the whole bound, as each page's request has the
 * client's own deadline, whose timeout is retryable (an abort of this signal would not be).
 */
function attempt(): { signal: AbortSignal } {
  return { signal: AbortSignal.timeout(HARNESS_RETRY_MS) };
}

/** How often the keeper looks at the run's API server (`#keep`). */
const KEEPER_INTERVAL_MS = 2_000;

let planted = 0;
let revocations = 0;

/** A run's Kubernetes store; with its API server when it owns one. */
export class K8sNemesisStore implements NemesisRunStore {
  readonly kind = "k8s";
  readonly spec: K8sNemesisSpec;
  readonly skewMs: number;
  /** The client the store's record and the endpoint writer use: they retry on their own. */
  readonly #client: KubeClient;
  /**
   * The harness's own calls (snapshots, counts, garbage, Lease revocations, a fault's reads):
   * each retried through the API-server and etcd restarts the run injects
   * (`./nemesis_retry.ts`), each attempt bounded by the client's request deadline.
   */
  readonly #harness: KubeClient;
  readonly #cluster?: KubeTestCluster;
  /** Where the API server's log is kept when the store stops (the run's directory). */
  readonly #logDir?: string;
  readonly #identities: KubeResourceDescriptor;

  /**
   * The store `spec` names, read through `client` (closed with the store); a `cluster` given is
   * the store's own, stopped with it, its API server's log copied into `logDir` first.
   */
  constructor(
    spec: K8sNemesisSpec,
    client: KubeClient,
    cluster?: KubeTestCluster,
    logDir?: string,
  ) {
    this.spec = spec;
    this.skewMs = spec.maxClockSkewMs;
    this.#client = client;
    this.#harness = retryingClient(client);
    this.#cluster = cluster;
    this.#logDir = logDir;
    this.#identities = identityResource(spec.group);
    if (cluster !== undefined) this.#keeper = this.#keep(cluster);
    if (cluster !== undefined && spec.heartbeatTimeoutMs !== undefined) {
      const writer = new EndpointWriter(client, this.#identities, spec.namespace);
      this.#endpoints = writer;
      this.ciliumCrd = {
        kubeconfig: spec.kubeconfig,
        heartbeatTimeoutMs: spec.heartbeatTimeoutMs,
        setEndpoint: (node, key, id) => writer.set(node, key, id),
        flushEndpoints: (timeoutMs) => writer.flush(timeoutMs),
      };
    }
  }

  /** Where Cilium CRD-mode nodes join: a store with its own API server and a heartbeat timeout. */
  readonly ciliumCrd?: CiliumCrdSide;
  readonly #endpoints?: EndpointWriter;

  /** Records identities, endpoints and node Leases (`./nemesis_cilium.ts`). */
  recordChanges(record: (change: StoreChange) => void): Promise<AsyncDisposable> {
    return recordK8sChanges(
      { client: this.#client, identities: this.#identities, namespace: this.spec.namespace },
      record,
    );
  }

  async #identityObjects(): Promise<KubeObject[]> {
    // The whole list is retried: a page's continue token does not survive a restart (410).
    return (await untilServed(
      "list identities",
      () => listAll(this.#client, this.#identities, attempt()),
    )).items;
  }

  async #leases(selector: string): Promise<KubeObject[]> {
    const { items } = await untilServed(
      `list Leases ${selector}`,
      () =>
        listAll(this.#client, LEASES, {
          namespace: this.spec.namespace,
          labelSelector: selector,
          ...attempt(),
        }),
    );
    return items;
  }

  async snapshot(): Promise<StoreSnapshot> {
    // Identities first, then the Leases that judge their references (as the backend's GC lists).
    const identities = await this.#identityObjects();
    const refObjects = await this.#leases(REFS_SELECTOR);
    const leases = await this.#leases(NODE_SELECTOR);
    return k8sSnapshot({ identities, refObjects, leases, now: Date.now(), skewMs: this.skewMs });
  }

  plant(kind: string, targets: GarbageTargets): Promise<Planted> {
    return plantK8s(
      {
        client: this.#harness,
        identities: this.#identities,
        endpoints: { ...this.#identities, plural: "ciliumendpoints", namespaced: true },
        namespace: this.spec.namespace,
      },
      kind,
      targets,
      `nemesis-ghost-${++planted}`,
    );
  }

  async revokeLease(node: string, random: () => number): Promise<string> {
    const name = nodeLeaseName(node);
    const namespace = this.spec.namespace;
    revocations++;
    try {
      if (random() < 0.5) {
        const deleted = await this.#harness.delete(LEASES, name, { namespace });
        return deleted ? `deleted ${node}'s Lease ${name}` : `${node} had no Lease`;
      }
      const epoch = `revoked${revocations}`;
      await this.#harness.patch(LEASES, name, {
        metadata: { annotations: { [EPOCH_ANNOTATION]: epoch } },
      }, { type: "merge", namespace });
      return `changed the epoch of ${node}'s Lease ${name} to ${epoch}`;
    } catch (err) {
      if (isStatus(err, 404)) return `${node} had no Lease`;
      throw err;
    }
  }

  async counts(): Promise<Record<string, number>> {
    const identities = await this.#identityObjects();
    const refObjects = await this.#leases(REFS_SELECTOR);
    const leases = await this.#leases(NODE_SELECTOR);
    const claims = await this.#leases(CLAIM_SELECTOR);
    const now = Date.now();
    return k8sCounts({ identities, refObjects, leases, claims, now, skewMs: this.skewMs });
  }

  fileBytes(): Promise<number> {
    return Promise.resolve(0);
  }

  async injectFault(kind: string, random: () => number): Promise<StoreFaultOutcome> {
    const cluster = this.#cluster;
    if (cluster === undefined) throw new Error(`${kind}: the store has no API server of its own`);
    this.#faulting++;
    try {
      return await injectK8sFault(
        { cluster, client: this.#harness, identities: this.#identities },
        kind,
        random,
      );
    } finally {
      this.#faulting--;
    }
  }

  /** Store faults in progress (the keeper leaves the API server to them meanwhile). */
  #faulting = 0;
  readonly #stopKeeper = new AbortController();
  #keeper?: Promise<void>;
  /** When and why the keeper started the API server again (see {@linkcode #keep}). */
  readonly revived: string[] = [];

  /**
   * The keeper of a store with its own API server: every {@linkcode KEEPER_INTERVAL_MS}, outside
   * a store fault, an API server whose process is gone is started again. Three runs in a row (at
   * load 30–40) lost their API server for good a while into the run, each time with no restart
   * attempted (no new process in its log, no fault record of it): a death outside any fault of
   * the run, which no retry of the harness outlives. Each revival is written to stderr and kept
   * in {@linkcode revived}.
   */
  async #keep(cluster: KubeTestCluster): Promise<void> {
    const signal = this.#stopKeeper.signal;
    while (!signal.aborted) {
      await sleep(KEEPER_INTERVAL_MS, signal).catch(() => {});
      if (signal.aborted || this.#faulting > 0) continue;
      try {
        const since = Date.now();
        if (await reviveApiServer(cluster)) {
          const line = `${new Date(since).toISOString()}: the run's kube-apiserver was gone ` +
            `outside any fault; started again in ${Date.now() - since} ms`;
          this.revived.push(line);
          console.error(`nemesis k8s store: ${line}`);
        }
      } catch (err) {
        console.error(`nemesis k8s store: could not start the run's kube-apiserver again: ${err}`);
      }
    }
  }

  /** Closes the client; stops the API server when the store owns it. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.#stopKeeper.abort();
    await this.#keeper;
    try {
      await this.#endpoints?.[Symbol.asyncDispose]();
      await this.#client.close();
    } finally {
      const cluster = this.#cluster;
      if (cluster !== undefined && this.#logDir !== undefined) {
        await copyFile(
          join(cluster.dir, "kube-apiserver.log"),
          join(this.#logDir, "kube-apiserver.log"),
        )
          .catch(() => {});
      }
      await cluster?.close();
    }
  }
}
