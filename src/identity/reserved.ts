/**
 * Reserved (1–10), well-known (100–115) and user-reserved (128–255) identities, with Cilium's
 * `LookupReservedIdentityByLabels` rules. None of them ever touches the store.
 *
 * @example Reserved lookups
 * ```ts
 * import assert from "node:assert/strict";
 * import { Labels, ReservedIdentities } from "@idalloc/idalloc/identity";
 *
 * const reserved = new ReservedIdentities({ fixedIdentities: { 129: "kvstore" } });
 * assert.equal(reserved.lookupByLabels(Labels.parse(["reserved:host"]))?.id, 1);
 * assert.equal(reserved.lookupByLabels(Labels.parse(["io.cilium.fixed-identity=kvstore"]))?.id, 129);
 * ```
 *
 * @module
 */
import { InvalidOptionsError } from "../errors.ts";
import {
  CLUSTER_LABEL_KEY,
  FIXED_IDENTITY_LABEL_KEY,
  Label,
  Labels,
  LabelSource,
} from "./labels.ts";
import { isUserReservedIdentity, ReservedIdentity, WellKnownIdentity } from "./numeric.ts";
import type { Identity } from "./types.ts";

/** Options of {@linkcode ReservedIdentities}. */
export interface ReservedIdentitiesOptions {
  /** The local cluster's name, part of the well-known label sets. @default {"default"} */
  readonly clusterName?: string;
  /** The namespace Cilium runs in, part of some well-known label sets. @default {"kube-system"} */
  readonly ciliumNamespace?: string;
  /**
   * User-reserved identities: numeric ID (128–255) → name. A label set with
   * `io.cilium.fixed-identity=<name>` gets that ID (Cilium's `fixed-identity-mapping`).
   */
  readonly fixedIdentities?: Readonly<Record<number, string>>;
  /**
   * Give label sets with `reserved:remote-node` their own identities in the remote-node scope
   * instead of the reserved `remote-node`/`kube-apiserver` IDs (Cilium with
   * `policy-cidr-match-mode=nodes` or node selector labels enabled). @default {false}
   */
  readonly remoteNodeScope?: boolean;
}

const POD_NAMESPACE = "io.kubernetes.pod.namespace";
const SERVICE_ACCOUNT = "io.cilium.k8s.policy.serviceaccount";
const NAMESPACE_NAME = "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name";

const reservedNames: ReadonlyArray<readonly [string, number]> = [
  ["host", ReservedIdentity.Host],
  ["world", ReservedIdentity.World],
  ["world-ipv4", ReservedIdentity.WorldIPv4],
  ["world-ipv6", ReservedIdentity.WorldIPv6],
  ["unmanaged", ReservedIdentity.Unmanaged],
  ["health", ReservedIdentity.Health],
  ["init", ReservedIdentity.Init],
  ["remote-node", ReservedIdentity.RemoteNode],
  ["kube-apiserver", ReservedIdentity.KubeAPIServer],
  ["ingress", ReservedIdentity.Ingress],
];

const reservedLabel = (name: string): Label => new Label(LabelSource.Reserved, name);
const HOST = reservedLabel("host");
const REMOTE_NODE = reservedLabel("remote-node");
const KUBE_APISERVER = reservedLabel("kube-apiserver");

/** The identity of ID 0 (`reserved:unknown`), returned for lookups of ID 0. */
export const UNKNOWN_IDENTITY: Identity = Object.freeze({
  id: ReservedIdentity.Unknown,
  labels: Labels.of(reservedLabel("unknown")),
});

function wellKnownSets(
  cluster: string,
  ns: string,
): Array<readonly [number, number, readonly string[], string]> {
  const k8s = (key: string, value: string) => `k8s:${key}=${value}`;
  return [
    [WellKnownIdentity.EtcdOperator, WellKnownIdentity.EtcdOperator2, [
      "k8s:io.cilium/app=etcd-operator",
      k8s(POD_NAMESPACE, ns),
      k8s(SERVICE_ACCOUNT, "cilium-etcd-sa"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], ns],
    [WellKnownIdentity.CiliumKVStore, WellKnownIdentity.CiliumKVStore2, [
      "k8s:app=etcd",
      "k8s:etcd_cluster=cilium-etcd",
      "k8s:io.cilium/app=etcd-operator",
      k8s(POD_NAMESPACE, ns),
      k8s(SERVICE_ACCOUNT, "default"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], ns],
    [WellKnownIdentity.KubeDNS, WellKnownIdentity.KubeDNS2, [
      "k8s:k8s-app=kube-dns",
      k8s(POD_NAMESPACE, "kube-system"),
      k8s(SERVICE_ACCOUNT, "kube-dns"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], "kube-system"],
    [WellKnownIdentity.EKSKubeDNS, WellKnownIdentity.EKSKubeDNS2, [
      "k8s:k8s-app=kube-dns",
      "k8s:eks.amazonaws.com/component=kube-dns",
      k8s(POD_NAMESPACE, "kube-system"),
      k8s(SERVICE_ACCOUNT, "kube-dns"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], "kube-system"],
    [WellKnownIdentity.EKSCoreDNS, WellKnownIdentity.EKSCoreDNS2, [
      "k8s:k8s-app=kube-dns",
      "k8s:eks.amazonaws.com/component=coredns",
      k8s(POD_NAMESPACE, "kube-system"),
      k8s(SERVICE_ACCOUNT, "coredns"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], "kube-system"],
    [WellKnownIdentity.CoreDNS, WellKnownIdentity.CoreDNS2, [
      "k8s:k8s-app=kube-dns",
      k8s(POD_NAMESPACE, "kube-system"),
      k8s(SERVICE_ACCOUNT, "coredns"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], "kube-system"],
    [WellKnownIdentity.CiliumOperator, WellKnownIdentity.CiliumOperator2, [
      "k8s:name=cilium-operator",
      "k8s:io.cilium/app=operator",
      "k8s:app.kubernetes.io/part-of=cilium",
      "k8s:app.kubernetes.io/name=cilium-operator",
      k8s(POD_NAMESPACE, ns),
      k8s(SERVICE_ACCOUNT, "cilium-operator"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], ns],
    [WellKnownIdentity.CiliumEtcdOperator, WellKnownIdentity.CiliumEtcdOperator2, [
      "k8s:name=cilium-etcd-operator",
      "k8s:io.cilium/app=etcd-operator",
      // Cilium's own spelling (": " instead of "="): the key is the whole text, the value empty.
      "k8s:app.kubernetes.io/name: cilium-etcd-operator",
      "k8s:app.kubernetes.io/part-of: cilium",
      k8s(POD_NAMESPACE, ns),
      k8s(SERVICE_ACCOUNT, "cilium-etcd-operator"),
      k8s(CLUSTER_LABEL_KEY, cluster),
    ], ns],
  ];
}

/**
 * The reserved, well-known and user-reserved identities of one configuration (Cilium keeps these
 * in package globals; here each {@linkcode IdentityAllocator} has its own).
 */
export class ReservedIdentities implements Iterable<Identity> {
  readonly #byId = new Map<number, Identity>();
  /** Cilium's `reservedIdentities`: name → ID, including user-reserved names. */
  readonly #idByName = new Map<string, number>();
  /** Well-known identities by their kvstore string, for exact-match lookups. */
  readonly #wellKnown = new Map<string, Identity>();
  readonly #remoteNodeScope: boolean;

  /** Builds the identities; throws {@linkcode InvalidOptionsError} for bad fixed identities. */
  constructor(options: ReservedIdentitiesOptions = {}) {
    const cluster = options.clusterName ?? "default";
    const ns = options.ciliumNamespace ?? "kube-system";
    this.#remoteNodeScope = options.remoteNodeScope ?? false;
    for (const [name, id] of reservedNames) {
      this.#idByName.set(name, id);
      const labels = id === ReservedIdentity.KubeAPIServer
        ? Labels.of(KUBE_APISERVER, REMOTE_NODE)
        : Labels.of(reservedLabel(name));
      this.#byId.set(id, Object.freeze({ id, labels }));
    }
    try {
      for (const [id, id2, labels, metaNs] of wellKnownSets(cluster, ns)) {
        this.#addWellKnown(id, Labels.parse(labels));
        this.#addWellKnown(id2, Labels.parse([...labels, `k8s:${NAMESPACE_NAME}=${metaNs}`]));
      }
    } catch (err) {
      throw new InvalidOptionsError("cluster name or namespace cannot be used in labels", {
        cause: err,
      });
    }
    for (const [key, name] of Object.entries(options.fixedIdentities ?? {})) {
      const id = Number(key);
      if (!Number.isInteger(id) || !isUserReservedIdentity(id)) {
        throw new InvalidOptionsError(`fixed identity ${key} is not in the user range 128–255`);
      }
      if (typeof name !== "string" || name === "" || this.#idByName.has(name)) {
        throw new InvalidOptionsError(`fixed identity ${id} needs a new, non-empty name`);
      }
      let label: Label;
      try {
        label = reservedLabel(name);
      } catch (err) {
        throw new InvalidOptionsError(`fixed identity name ${JSON.stringify(name)} is invalid`, {
          cause: err,
        });
      }
      this.#idByName.set(name, id);
      this.#byId.set(id, Object.freeze({ id, labels: Labels.of(label) }));
    }
  }

  #addWellKnown(id: number, labels: Labels): void {
    const identity = Object.freeze({ id, labels });
    this.#byId.set(id, identity);
    this.#wellKnown.set(labels.toKvstoreString(), identity);
  }

  /** Cilium's `LookupReservedIdentity`: the reserved, well-known or user-reserved identity `id`. */
  lookupById(id: number): Identity | undefined {
    return this.#byId.get(id);
  }

  /** Whether `id` is one of these identities (Cilium's `Identity.IsReserved`). */
  isReserved(id: number): boolean {
    return this.#byId.has(id);
  }

  /** Cilium's `GetReservedID`: the ID of a reserved or user-reserved name. */
  idOf(name: string): number | undefined {
    return this.#idByName.get(name);
  }

  /**
   * Cilium's `LookupReservedIdentityByLabels`:
   * 1. an exact well-known label set → its identity;
   * 2. an `io.cilium.fixed-identity` label → that user-reserved identity, or nothing;
   * 3. no `reserved` label → nothing;
   * 4. `reserved:host` → host (1); `reserved:remote-node` → remote-node (6), or kube-apiserver (7)
   *    with `reserved:kube-apiserver` (nothing in remote-node-scope mode); these carry all given
   *    labels;
   * 5. otherwise exactly one `reserved` label naming a (non-user) reserved identity → it.
   */
  lookupByLabels(labels: Labels): Identity | undefined {
    const wellKnown = this.#wellKnown.get(labels.toKvstoreString());
    if (wellKnown) return wellKnown;

    const fixed = labels.get(FIXED_IDENTITY_LABEL_KEY);
    if (fixed) {
      const id = this.#idByName.get(fixed.value);
      return id !== undefined && isUserReservedIdentity(id) ? this.#byId.get(id) : undefined;
    }

    if (!labels.hasSource(LabelSource.Reserved)) return undefined;

    let id: number = ReservedIdentity.Unknown;
    if (labels.has(HOST)) {
      id = ReservedIdentity.Host;
    } else if (labels.has(REMOTE_NODE)) {
      if (this.#remoteNodeScope) return undefined;
      id = labels.has(KUBE_APISERVER)
        ? ReservedIdentity.KubeAPIServer
        : ReservedIdentity.RemoteNode;
    }
    if (id !== ReservedIdentity.Unknown) return { id, labels };

    // Only a lone reserved label may name a reserved identity: workloads cannot borrow one by
    // adding a reserved label to their own.
    if (labels.size !== 1) return undefined;
    const [only] = labels;
    const named = this.#idByName.get(only.key);
    return named !== undefined && !isUserReservedIdentity(named)
      ? this.#byId.get(named)
      : undefined;
  }

  /** Every identity, by ascending ID. */
  [Symbol.iterator](): IterableIterator<Identity> {
    return [...this.#byId.values()].sort((a, b) => a.id - b.id)[Symbol.iterator]();
  }
}
