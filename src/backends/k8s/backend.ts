/**
 * {@linkcode K8sBackend}: configuration plus the connection to the Kubernetes API server; sessions
 * do the work.
 *
 * @example
 * ```ts
 * import { K8sBackend } from "./backend.ts";
 *
 * // Needs an API server: a function here, so that the doc tests type-check it without calling it.
 * async function checked(): Promise<string> {
 *   await using backend = await K8sBackend.connect({ node: "10.0.0.1", kubeconfig: "kubeconfig" });
 *   backend.checkKey("k8s:app=web;");
 *   return backend.namespace;
 * }
 * ```
 *
 * @module
 */
import type {
  Backend,
  BackendAdmin,
  BackendSession,
  SessionOptions,
} from "../../allocator/backend.ts";
import type { DamageFinding, DamageScanOptions, StoreDoctor } from "../../allocator/damage.ts";
import { InvalidKeyError } from "../../errors.ts";
import { K8sAdmin } from "./admin.ts";
import { ServerClock } from "./clock.ts";
import type { K8sContext } from "./context.ts";
import { findDamage, removeDamage } from "./doctor.ts";
import { createKubeClient, type KubeClient } from "./client.ts";
import { inClusterConnection, loadKubeconfig } from "./kubeconfig.ts";
import { keyProblem } from "./layout.ts";
import {
  endpointResource,
  endpointSliceResource,
  identityResource,
  type K8sBackendOptions,
  resolveK8sOptions,
  resourceName,
  storeGraceMs,
} from "./options.ts";
import { K8sSession } from "./session.ts";
import { timedClient } from "./telemetry.ts";
import { StoreTelemetry } from "../../telemetry/store.ts";

function never(): AbortSignal {
  return new AbortController().signal;
}

/** Options of {@linkcode K8sBackend.connect} besides the backend's own. */
export interface K8sConnectOptions {
  /** Aborts connecting. */
  readonly signal?: AbortSignal;
  /**
   * An API client to use instead of one made from the kubeconfig or in-cluster configuration
   * (the backend does not close it).
   */
  readonly client?: KubeClient;
}

/**
 * The Kubernetes backend, in Cilium's CRD layout (`identity-allocation-mode: crd`):
 * `CiliumIdentity` objects named by their ID, references of idalloc nodes as annotations on them,
 * node `Lease`s for liveness, and a claim `Lease` per key so that idalloc nodes never create two
 * identities for one key. Cilium's CRD-mode agents read what idalloc writes, and idalloc answers
 * the identity Cilium's own lookup answers.
 *
 * A new key costs two writes uncontended (claim, identity), an existing key one patch. Close it
 * with `close()` or `await using` after its allocators.
 */
export class K8sBackend implements Backend, StoreDoctor, AsyncDisposable {
  /** Always `k8s`. */
  readonly kind: string = "k8s";
  /** This node's name. */
  readonly node: string;
  readonly #ctx: K8sContext;
  readonly #sessions = new Set<K8sSession>();
  readonly #ownsClient: boolean;

  private constructor(ctx: K8sContext, ownsClient: boolean) {
    this.#ctx = ctx;
    this.node = ctx.node;
    this.#ownsClient = ownsClient;
  }

  /**
   * Validates `options` (throws `InvalidOptionsError`), connects to the API server of the
   * kubeconfig (or the in-cluster configuration) and checks within `connectTimeoutMs` that it is
   * Kubernetes, that the identity resource is installed, and that the user may read it (a
   * writable session checks the Leases when it opens). Failures come as the client's classes: `StoreConnectionRefusedError`,
   * `StoreHostNotFoundError`, `StoreTlsError`, `StoreUnavailableError` (no answer),
   * `StoreAccessDeniedError` (401, or 403 naming the RBAC rule to add),
   * `ResourceNotInstalledError`, `NotIdentityResourceError` (the resource is served but namespaced
   * or of another kind), `NotKubernetesApiError`.
   */
  static async connect(
    options: K8sBackendOptions,
    connectOptions: K8sConnectOptions = {},
  ): Promise<K8sBackend> {
    const settings = resolveK8sOptions(options);
    const { signal } = connectOptions;
    signal?.throwIfAborted();
    let client = connectOptions.client;
    const owns = client === undefined;
    if (client === undefined) {
      const connection = settings.inCluster
        ? await inClusterConnection()
        : await loadKubeconfig(settings.kubeconfig, settings.context);
      client = await createKubeClient(connection, { requestTimeoutMs: settings.requestTimeoutMs });
    }
    const { group, version, kind } = settings.resource;
    const telemetry = new StoreTelemetry(
      "k8s",
      `${resourceName(settings)}/${version}`,
      settings.node,
    );
    // Every round trip timed, as on the other backends (`./telemetry.ts`).
    client = timedClient(client, telemetry);
    const endpoints = endpointResource(settings);
    const endpointSlices = endpointSliceResource(settings);
    const ctx: K8sContext = {
      client,
      telemetry,
      settings,
      node: settings.node,
      // The store's, never the context's or the pod's (`coordination.ts`).
      namespace: settings.namespace,
      clock: new ServerClock(settings.now),
      identities: { ...identityResource(settings), kind },
      identityKind: { apiVersion: `${group}/${version}`, kind },
      resourceName: resourceName(settings),
      ...(endpoints === undefined ? {} : { endpoints }),
      ...(endpointSlices === undefined ? {} : { endpointSlices }),
    };
    try {
      // Fast and in words: the server is Kubernetes, the CRD is installed, the user may read it.
      // The Leases are checked when a writable session opens (`session.ts`): a read-only run
      // (`list`, `get`, `watch`) needs no right on them. Write rights are told by the first
      // write's answer (403 names the rule); so are the endpoints' (only GC lists them).
      await client.probe([
        // The kind too: a served resource of other objects (Leases, a namespaced CRD) is refused
        // here, in one line, rather than read as an empty store or written to in vain.
        { resource: ctx.identities, verbs: ["get", "list", "watch"], kind },
      ], { timeoutMs: settings.connectTimeoutMs, ...(signal === undefined ? {} : { signal }) });
    } catch (err) {
      if (owns) await client.close();
      throw err;
    }
    return new K8sBackend(ctx, owns);
  }

  /**
   * The backend's API client, with the backend's credentials (for reading or removing what it
   * wrote, as `examples/k8s` does). Closed with the backend when the backend made it.
   */
  get client(): KubeClient {
    return this.#ctx.client;
  }

  /**
   * This store's default GC grace: `gcGraceMs`, else Cilium operator's heartbeat timeout
   * (`heartbeatTimeoutMs`), so that idalloc's GC keeps a new or freshly marked identity as long as
   * Cilium's operator does.
   */
  get defaultGcGraceMs(): number {
    return storeGraceMs(this.#ctx.settings);
  }

  /** The API server's URL. */
  get server(): string {
    return this.#ctx.client.server;
  }

  /** The coordination namespace: of the node Leases and key claims (`coordination.ts`). */
  get namespace(): string {
    return this.#ctx.namespace;
  }

  /** The identity resource, `<plural>.<group>`. */
  get resource(): string {
    return this.#ctx.resourceName;
  }

  /**
   * Throws {@linkcode InvalidKeyError} for a key this layout cannot hold: empty, not well-formed
   * Unicode, with NUL, larger than `MAX_KEY_BYTES` (its claim carries it as an annotation), or a
   * label set carrying the reserved `idalloc:key` label.
   */
  checkKey(key: string): void {
    const problem = keyProblem(key);
    if (problem !== undefined) throw new InvalidKeyError(problem);
  }

  /**
   * Opens a session (the node's Lease, the informer). A writable session under a node name whose
   * Lease another process keeps live throws `NodeInUseError`, unless the options say `restart`.
   */
  async openSession(options: SessionOptions): Promise<BackendSession> {
    const session = await K8sSession.open(
      this.#ctx,
      options,
      (s) => this.#sessions.delete(s),
    );
    this.#sessions.add(session);
    return session;
  }

  /**
   * Lists the damaged identities, references, claims and node Leases (see
   * {@linkcode StoreDoctor.findDamage}): reads only, and needs no session.
   */
  findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding> {
    return findDamage(this.#ctx, options);
  }

  /** Deletes the entry of `finding` if unchanged since it was listed. */
  async removeDamage(
    finding: Pick<DamageFinding, "token">,
    options?: { readonly signal?: AbortSignal },
  ): Promise<boolean> {
    return await removeDamage(this.#ctx, finding, options?.signal ?? never());
  }

  /** The operator's view: node Leases, references with their liveness, deleting one. */
  admin(): BackendAdmin {
    return new K8sAdmin(this.#ctx);
  }

  /** Closes open sessions (and the client, when the backend made it). Idempotent. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.#sessions].map((s) => s.close()));
    if (this.#ownsClient) await this.#ctx.client.close();
  }

  /** Same as {@linkcode K8sBackend.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
