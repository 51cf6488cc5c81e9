/**
 * The Kubernetes `BackendFactory` of the shared test suites: the run's kube-apiserver
 * (`sharedKubeApiServer`: the test launcher's, else a private one per process), and per fixture a
 * copy of Cilium's `CiliumIdentity` and `CiliumEndpoint` CRDs under a random group of its own
 * (empty: a group an earlier fixture of the run emptied, see `./crd_pool.ts`, or a new one) plus a
 * fresh Kubernetes namespace for the node Leases and key claims, so that fixtures sharing the
 * server never see each other. Disposing a fixture empties its group (or deletes its CRDs) and
 * deletes its namespace's Leases.
 *
 * Every damage method writes through the API as a broken writer would (a `kubectl edit`, a
 * script): no guard of the protocol is taken.
 *
 * Timing knobs: `fast` → clock skew 250 ms; otherwise 500 ms. Lease TTLs given to the allocator
 * must be at least twice the skew, and the API server keeps lease durations in whole seconds.
 *
 * @example
 * ```ts ignore
 * // ignored: starts a private kube-apiserver; the shared suites run it (tests/conformance/).
 * await using fx = await k8sFactory.create();
 * const backend = await fx.backend("node-a", { fast: true });
 * console.log(await fx.masters());
 * ```
 * @module
 */
import type { Backend } from "../../../allocator/backend.ts";
import type {
  BackendFactory,
  NodeBackendOptions,
  OpenFromSpec,
  StoredReference,
  StoreFixture,
  StoreSpec,
} from "../../../testing/fixture.ts";
import { K8sBackend } from "../backend.ts";
import type { KubeClient, KubeObject, KubeResourceDescriptor } from "../client.ts";
import { isStatus } from "../kube.ts";
import {
  CLAIM_PREFIX,
  CLAIM_SELECTOR,
  claimName,
  ID_LABEL,
  identityObject,
  idOfName,
  KEY_ANNOTATION,
  keyOfSecurityLabels,
  MANAGED_BY_LABEL,
  NODE_SELECTOR,
  nodeLeaseName,
  nodeLeaseObject,
  type NodeLeaseRecord,
  nodeOfRefAnnotation,
  readClaim,
  readIdentity,
  readNodeLease,
  refAnnotation,
  RESERVED_KEY_LABEL,
  ROLE_LABEL,
  sanitizedLabels,
  securityLabelsOf,
} from "../layout.ts";
import { MAX_KEY_BYTES, utf8Length } from "../limits.ts";
import { refLive } from "../liveness.ts";
import { readReferenceObjects, referencesById, referencingNodes } from "../refs.ts";
import { LEASES } from "../options.ts";
import { listAll } from "../paging.ts";
import { kubeApiserverUnavailable, type KubeTestCluster, sharedKubeApiServer } from "./cluster.ts";
import { type FixtureGroup, fixtureGroupPool, takeFixtureGroup } from "./crd_pool.ts";
import { NAMESPACE_RESOURCE } from "./crds.ts";

/** The kubeconfig context the fixtures' kubeconfigs name (their current context is another). */
export const FIXTURE_CONTEXT = "test";

/**
 * The store's own GC grace in the shared suites: none. They judge GC and the doctor by the
 * allocator's rules, the same on every store (an allocator's `gcGraceMs` still applies); this
 * store's default, Cilium's heartbeat timeout for new or freshly marked identities, is covered by
 * `tests/backends/k8s/gc.test.ts` and `doctor.test.ts`.
 */
const SHARED_SUITES_GRACE_MS = 0;

/** The clock-skew margin of a fixture backend. */
export function k8sSkewMs(options?: NodeBackendOptions): number {
  return options?.fast ? 250 : 500;
}

/** What a child process needs to reach a fixture's store (`StoreSpec.store`). */
export interface K8sSpecStore {
  readonly kubeconfig: string;
  readonly context: string;
  readonly namespace: string;
  readonly group: string;
}

/** The store a spec (or a bench's `where`) names; throws a `TypeError` for anything else. */
export function k8sSpecStore(store: unknown): K8sSpecStore {
  const s = store as Partial<K8sSpecStore> | null;
  if (
    typeof s?.kubeconfig !== "string" || typeof s.namespace !== "string" ||
    typeof s.group !== "string" || typeof s.context !== "string"
  ) {
    throw new TypeError("a Kubernetes store spec names a kubeconfig, context, namespace and group");
  }
  return s as K8sSpecStore;
}

/** Opens a node's Kubernetes backend on the store a spec names (in a child process). */
export const openFromSpec: OpenFromSpec = async (
  spec: StoreSpec,
  node: string,
  options?: NodeBackendOptions,
): Promise<{ backend: Backend } & AsyncDisposable> => {
  const { kubeconfig, context, namespace, group } = k8sSpecStore(spec.store);
  const backend = await K8sBackend.connect({
    node,
    kubeconfig,
    context,
    namespace,
    resource: { group },
    maxClockSkewMs: k8sSkewMs(options),
    gcGraceMs: SHARED_SUITES_GRACE_MS,
  });
  return { backend, [Symbol.asyncDispose]: () => backend.close() };
};

/**
 * `security-labels` that name no key: the reserved label holding a label set (which would read
 * back as another key). An empty value would do too, but this API server refuses empty strings
 * in a CRD's string maps.
 */
const UNDECODABLE = { [RESERVED_KEY_LABEL]: "k8s:corrupt=1;" };

/** The key of `{idalloc:key: S}` where S is larger than the layout's limit, else `undefined`. */
function oversizedKey(labels: unknown): string | undefined {
  const map = labels as Record<string, unknown> | null;
  const key = map?.[RESERVED_KEY_LABEL];
  return typeof key === "string" && Object.keys(map!).length === 1 &&
      utf8Length(key) > MAX_KEY_BYTES
    ? key
    : undefined;
}

/** The readable references (node → epoch) on an identity object, whatever its labels. */
function refsOf(obj: KubeObject): Map<string, string> {
  const refs = new Map<string, string>();
  for (const [annotation, epoch] of Object.entries(obj.metadata.annotations ?? {})) {
    const node = nodeOfRefAnnotation(annotation);
    if (node !== undefined && typeof epoch === "string" && epoch !== "") refs.set(node, epoch);
  }
  return refs;
}

/** One generous bound for a direct call of the fixture. */
function bounded(): { signal: AbortSignal } {
  return { signal: AbortSignal.timeout(30_000) };
}

/** Leases of planted references live this long (a node's own renewals replace them). */
const PLANTED_LEASE_SECONDS = 600;

/** One fixture: an identity resource and a namespace of its own on the shared server. */
export class K8sStoreFixture implements StoreFixture {
  readonly kind = "k8s";
  /** The server. */
  readonly cluster: KubeTestCluster;
  /** The identity resource's group (random; reused by a later fixture once this one is done). */
  readonly group: string;
  /** The namespace of Leases and claims (random). */
  readonly namespace: string;
  /** The identity resource. */
  readonly identities: KubeResourceDescriptor;
  /** An admin kubeconfig whose `test` context names the namespace. */
  readonly kubeconfig: string;
  readonly #client: KubeClient;
  readonly #group: FixtureGroup;
  readonly #backends: K8sBackend[] = [];
  /** Skew margin per node, to judge liveness as the node's own backend does. */
  readonly #skew = new Map<string, number>();

  private constructor(
    cluster: KubeTestCluster,
    client: KubeClient,
    group: FixtureGroup,
    namespace: string,
    kubeconfig: string,
  ) {
    this.cluster = cluster;
    this.#client = client;
    this.#group = group;
    this.group = group.group;
    this.namespace = namespace;
    this.identities = group.identities;
    this.kubeconfig = kubeconfig;
  }

  /** Takes a CRD group ({@linkcode takeFixtureGroup}) and creates the namespace. */
  static async create(): Promise<K8sStoreFixture> {
    const cluster = await sharedKubeApiServer();
    const suffix = crypto.randomUUID().replaceAll("-", "").slice(0, 12);
    const namespace = `idalloc-${suffix}`;
    const fixtureGroup = await takeFixtureGroup(cluster, { pool: fixtureGroupPool() });
    const client = await cluster.client("admin", namespace);
    try {
      await client.create(NAMESPACE_RESOURCE, {
        apiVersion: "v1",
        kind: "Namespace",
        metadata: { name: namespace },
      }, bounded());
      const kubeconfig = await cluster.kubeconfig("admin", { context: FIXTURE_CONTEXT, namespace });
      return new K8sStoreFixture(cluster, client, fixtureGroup, namespace, kubeconfig);
    } catch (err) {
      await fixtureGroup.release(client);
      await client.close();
      throw err;
    }
  }

  async backend(node: string, options?: NodeBackendOptions): Promise<Backend> {
    const skew = k8sSkewMs(options);
    this.#skew.set(node, skew);
    // Each node its own client from the kubeconfig, as separate processes would have.
    const backend = await K8sBackend.connect({
      node,
      kubeconfig: this.kubeconfig,
      context: FIXTURE_CONTEXT,
      namespace: this.namespace,
      resource: { group: this.group },
      maxClockSkewMs: skew,
      gcGraceMs: SHARED_SUITES_GRACE_MS,
      // The run's one API server serves every test process at once: on a loaded machine its
      // first answers (version, access review) took over the default 5 s.
      connectTimeoutMs: 30_000,
    });
    this.#backends.push(backend);
    return backend;
  }

  spec(): StoreSpec {
    return {
      kind: "k8s",
      store: {
        kubeconfig: this.kubeconfig,
        context: FIXTURE_CONTEXT,
        namespace: this.namespace,
        group: this.group,
      } satisfies K8sSpecStore,
      cli: [
        "--store",
        `k8s:${this.kubeconfig}`,
        "--context",
        FIXTURE_CONTEXT,
        "--namespace",
        this.namespace,
        "--prefix",
        `ciliumidentities.${this.group}/v2`,
        "--clock-skew",
        "250ms",
        "--gc-grace",
        "0s",
      ],
    };
  }

  /** Every identity object. */
  async #objects(): Promise<KubeObject[]> {
    return (await listAll(this.#client, this.identities, bounded())).items;
  }

  /** Every node Lease of the namespace, by node. */
  async #leases(): Promise<Map<string, NodeLeaseRecord>> {
    const { items } = await listAll(this.#client, LEASES, {
      namespace: this.namespace,
      labelSelector: NODE_SELECTOR,
      ...bounded(),
    });
    const out = new Map<string, NodeLeaseRecord>();
    for (const obj of items) {
      const lease = readNodeLease(obj);
      if (lease !== undefined && lease.name === nodeLeaseName(lease.node)) {
        out.set(lease.node, lease);
      }
    }
    return out;
  }

  async masters(): Promise<Map<number, string>> {
    const out = new Map<number, string>();
    for (const obj of await this.#objects()) {
      const read = readIdentity(obj);
      if (read.ok) out.set(read.record.id, read.record.key);
      else {
        // A key too large for the layout is still the master's key (as on the other backends).
        const id = idOfName(obj.metadata.name);
        const key = oversizedKey(obj["security-labels"]);
        if (id !== undefined && key !== undefined) out.set(id, key);
      }
    }
    return out;
  }

  async references(): Promise<StoredReference[]> {
    // Identities first, as the backend's admin reads them: every reference listed then predates
    // the Lease it is judged by.
    const objects = await this.#objects();
    const byId = referencesById(
      (await readReferenceObjects(
        { client: this.#client, namespace: this.namespace },
        AbortSignal.timeout(30_000),
      )).values(),
    );
    const leases = await this.#leases();
    const claimed = await this.#claimedKeys();
    const now = Date.now();
    const out: StoredReference[] = [];
    for (const obj of objects) {
      const read = readIdentity(obj);
      const id = read.ok ? read.record.id : idOfName(obj.metadata.name);
      // On this layout a reference's key is its identity's: for a damaged identity, the key its
      // claim names (the other layouts keep a reference's key beside it).
      const key = read.ok ? read.record.key : claimed.get(id ?? 0);
      if (id === undefined || key === undefined) continue;
      // Both layouts: the nodes' reference objects, and annotations on the identity.
      const nodes = referencingNodes(
        [...refsOf(obj), ...byId.get(id) ?? []],
        (node, epoch) => refLive(epoch, leases.get(node), now, this.#skew.get(node) ?? 500),
      );
      for (const [node, live] of nodes) out.push({ key, node, id, live });
    }
    return out;
  }

  /** ID → key of every claim that alone names its ID. */
  async #claimedKeys(): Promise<Map<number, string>> {
    const { items } = await listAll(this.#client, LEASES, {
      namespace: this.namespace,
      labelSelector: CLAIM_SELECTOR,
      ...bounded(),
    });
    const keys = new Map<number, string | undefined>();
    for (const claim of items.map(readClaim)) {
      if (claim === undefined) continue;
      keys.set(claim.id, keys.has(claim.id) ? undefined : claim.key);
    }
    return new Map([...keys].flatMap(([id, key]) => key === undefined ? [] : [[id, key]]));
  }

  /**
   * The epoch of `node`'s Lease; a missing or lapsed one is replaced by a Lease of a new epoch,
   * live for {@linkcode PLANTED_LEASE_SECONDS} (as another writer could make one).
   */
  async #liveEpoch(node: string): Promise<string> {
    const name = nodeLeaseName(node);
    const current = await this.#client.get(LEASES, name, {
      namespace: this.namespace,
      ...bounded(),
    });
    const lease = current === undefined ? undefined : readNodeLease(current);
    const now = Date.now();
    // A running node's Lease is left alone (a write would make its next renewal fail).
    if (lease?.epoch !== undefined && lease.expiresAt !== undefined && lease.expiresAt > now) {
      return lease.epoch;
    }
    const epoch = `planted${crypto.randomUUID().slice(0, 8)}`;
    const body = nodeLeaseObject(node, epoch, PLANTED_LEASE_SECONDS, now, now);
    if (current === undefined) {
      await this.#client.create(LEASES, body, { namespace: this.namespace, ...bounded() });
    } else {
      await this.#client.patch(LEASES, name, { metadata: body.metadata, spec: body.spec }, {
        type: "merge",
        namespace: this.namespace,
        ...bounded(),
      });
    }
    return epoch;
  }

  /**
   * On this layout a reference is an annotation on the identity, which carries the key: identity
   * `id` gets node `node`'s annotation under its live Lease, created for `key` when missing (a
   * second identity of the key, as Cilium's agents can make). An `id` that carries another key
   * cannot hold a reference to `key` here: that throws.
   */
  async plantReference(key: string, node: string, id: number): Promise<void> {
    const epoch = await this.#liveEpoch(node);
    const current = await this.#client.get(this.identities, String(id), bounded());
    if (current === undefined) {
      await this.#createIdentity(id, key, { [refAnnotation(node)]: epoch });
      return;
    }
    const read = readIdentity(current);
    if (!read.ok || read.record.key !== key) {
      throw new Error(`identity ${id} carries another key: it cannot hold a reference to ${key}`);
    }
    await this.#annotate(id, { [refAnnotation(node)]: epoch });
  }

  /**
   * An annotation `ref.idalloc.io/<node>` with no epoch on an identity of `key` (created under a
   * free ID above the suites' ranges when the key has none), while `node`'s Lease is live.
   */
  async plantCorruptReference(key: string, node: string): Promise<void> {
    await this.#liveEpoch(node);
    const objects = await this.#objects();
    const mine = objects.map(readIdentity).find((r) => r.ok && r.record.key === key);
    if (mine?.ok) {
      await this.#annotate(mine.record.id, { [refAnnotation(node)]: "" });
      return;
    }
    const taken = new Set(objects.map((o) => String(o.metadata.name)));
    let id = 900_001;
    while (taken.has(String(id))) id++;
    await this.#createIdentity(id, key, { [refAnnotation(node)]: "" });
  }

  /**
   * The core damage kinds — an identity not named by an ID, one whose labels do not decode, a
   * reference annotation without an epoch — and the kinds only this layout holds: a second
   * identity of a key, a claim naming no identity, a claim naming nothing, and a node Lease
   * without an epoch.
   */
  async plantCorruptEntries(): Promise<void> {
    await this.#createRaw("not-a-number", { "k8s:corrupt": "1" });
    await this.#createRaw("987654", UNDECODABLE);
    await this.#createIdentity(987_655, "k8s:corrupt=2;", { [refAnnotation("node-x")]: "" });
    // One creation second may hold both: the lower ID is then Cilium's answer either way.
    await this.#createIdentity(987_656, "k8s:corrupt=3;", {});
    await this.#createIdentity(987_657, "k8s:corrupt=3;", {});
    const claim = (name: string, labels: Record<string, string>, key?: string): KubeObject => ({
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: {
        name,
        labels: { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "claim", ...labels },
        ...(key === undefined ? {} : { annotations: { [KEY_ANNOTATION]: key } }),
      },
      spec: { holderIdentity: "node-x" },
    });
    const resource = `ciliumidentities.${this.group}`;
    const leases = { namespace: this.namespace, ...bounded() };
    await this.#client.create(
      LEASES,
      claim(claimName(resource, "k8s:corrupt=4;"), { [ID_LABEL]: "987658" }, "k8s:corrupt=4;"),
      leases,
    );
    await this.#client.create(LEASES, claim(`${CLAIM_PREFIX}garbage`, {}), leases);
    await this.#client.create(LEASES, {
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: {
        name: nodeLeaseName("node-y"),
        labels: { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "node" },
      },
      spec: { holderIdentity: "node-y", leaseDurationSeconds: 10 },
    }, leases);
  }

  /** An identity whose key (one `idalloc:key` label) is larger than the layout's limit. */
  async plantOversizedMaster(id: number): Promise<void> {
    await this.#createRaw(String(id), { "idalloc:key": "k".repeat(300_000) });
  }

  /** Gives identity `id` (created when missing) `security-labels` that name no key. */
  async corruptMaster(id: number): Promise<void> {
    try {
      await this.#client.patch(this.identities, String(id), [
        { op: "replace", path: "/security-labels", value: UNDECODABLE },
      ], { type: "json", ...bounded() });
    } catch (err) {
      if (!isStatus(err, 404)) throw err;
      await this.#createRaw(String(id), UNDECODABLE);
    }
  }

  async deleteMaster(id: number): Promise<void> {
    // The identity alone, as `kubectl delete` would: its key's claim stays.
    await this.#client.delete(this.identities, String(id), bounded());
  }

  /**
   * Gives identity `id` the labels of `key` (creating it when missing), as `kubectl edit` could.
   * The references on it go: they were the old key's holders' (on the other layouts a reference
   * names its key, so a rewritten master leaves them to the old key).
   */
  async rewriteMaster(id: number, key: string): Promise<void> {
    const map = securityLabelsOf(key);
    if (keyOfSecurityLabels(map) !== key) throw new Error(`not a key of this layout: ${key}`);
    const current = await this.#client.get(this.identities, String(id), bounded());
    if (current === undefined) {
      await this.#createIdentity(id, key, {});
      return;
    }
    // A merge patch merges maps: every old entry is removed (null) unless set anew.
    const cleared = (old: unknown, keep: (name: string) => boolean = () => false) =>
      Object.fromEntries(
        Object.keys((old ?? {}) as Record<string, unknown>).filter((k) => !keep(k)).map((
          k,
        ) => [k, null]),
      );
    await this.#client.patch(this.identities, String(id), {
      "security-labels": { ...cleared(current["security-labels"]), ...map },
      metadata: {
        labels: { ...cleared(current.metadata.labels), ...sanitizedLabels(map) },
        annotations: cleared(
          current.metadata.annotations,
          (name) => nodeOfRefAnnotation(name) === undefined,
        ),
      },
    }, { type: "merge", ...bounded() });
  }

  async dropLease(node: string): Promise<void> {
    await this.#client.delete(LEASES, nodeLeaseName(node), {
      namespace: this.namespace,
      ...bounded(),
    });
  }

  async deleteReference(key: string, node: string): Promise<void> {
    for (const obj of await this.#objects()) {
      const read = readIdentity(obj);
      if (!read.ok || read.record.key !== key || !read.record.refs.has(node)) continue;
      await this.#annotate(read.record.id, { [refAnnotation(node)]: null });
    }
  }

  /** Merge-patches identity `id`'s annotations (no precondition). */
  async #annotate(id: number, annotations: Record<string, string | null>): Promise<void> {
    await this.#client.patch(this.identities, String(id), { metadata: { annotations } }, {
      type: "merge",
      ...bounded(),
    });
  }

  async #createIdentity(id: number, key: string, annotations: Record<string, string>) {
    const { group, version, kind } = this.identities;
    await this.#client.create(
      this.identities,
      identityObject({ apiVersion: `${group}/${version}`, kind: kind! }, id, key, annotations),
      bounded(),
    );
  }

  async #createRaw(name: string, labels: Record<string, string>): Promise<void> {
    const { group, version, kind } = this.identities;
    await this.#client.create(this.identities, {
      apiVersion: `${group}/${version}`,
      kind: kind!,
      metadata: { name },
      "security-labels": labels,
    }, bounded());
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.allSettled(this.#backends.map((b) => b.close()));
    try {
      // The group is emptied for the next fixture (or its CRDs deleted); Leases go one by one (a
      // namespace is only emptied by the controller manager, which the test server lacks).
      await this.#group.release(this.#client);
      const { items } = await listAll(this.#client, LEASES, {
        namespace: this.namespace,
        ...bounded(),
      });
      await Promise.allSettled(
        items.map((obj) =>
          this.#client.delete(LEASES, String(obj.metadata.name), {
            namespace: this.namespace,
            ...bounded(),
          })
        ),
      );
      await this.#client.delete(NAMESPACE_RESOURCE, this.namespace, bounded()).catch(() => {});
    } finally {
      await this.#client.close();
    }
  }
}

/** The Kubernetes factory of the shared suites. */
export const k8sFactory: BackendFactory = {
  kind: "k8s",
  traits: {
    counters: false,
    // Every write is its own request.
    groupCommit: false,
    // A node's informer removes Cilium's heartbeat mark from the identities it holds.
    holdersUnmark: true,
    holdersRepairAtOnce: true,
    // Lease durations are whole seconds, and a TTL must be at least twice the skew (250 ms fast).
    minLeaseTtlMs: 1_000,
    // A dead node's reference annotations stay on the identities until GC or a node removes them.
    deadReferencesStay: true,
    plantedDamageKinds: [
      "key-duplicate",
      "claim-stale",
      "claim-undecodable",
      "node-lease-undecodable",
    ],
    repairedByRemoval: [],
  },
  get unavailable(): string | undefined {
    return kubeApiserverUnavailable();
  },
  create: () => K8sStoreFixture.create(),
  openFromSpec,
};
