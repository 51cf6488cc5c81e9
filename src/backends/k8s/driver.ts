/**
 * The Kubernetes driver: `--store k8s:<kubeconfig>` or `k8s:in-cluster`, in Cilium's CRD layout
 * (see `./store_description.ts` for how a store is named). The client is loaded only when a store
 * is opened, so that tools listing the drivers never pay for it.
 *
 * @module
 */
import type { BackendDriver, DriverFailure, DriverOpenOptions, OpenedBackend } from "../driver.ts";
import {
  describeK8sStore,
  IN_CLUSTER,
  K8S_OPTIONS,
  type K8sStoreDescription,
  k8sStoreDescription,
} from "./store_description.ts";

async function open(d: K8sStoreDescription, options: DriverOpenOptions): Promise<OpenedBackend> {
  const { K8sBackend } = await import("./backend.ts");
  const backend = await K8sBackend.connect({
    node: options.node,
    ...(d.kubeconfig === undefined ? {} : { kubeconfig: d.kubeconfig }),
    ...(d.inCluster ? { inCluster: true } : {}),
    ...(d.context === undefined ? {} : { context: d.context }),
    ...(d.namespace === undefined ? {} : { namespace: d.namespace }),
    resource: d.resource,
    maxClockSkewMs: d.maxClockSkewMs,
    heartbeatTimeoutMs: d.heartbeatTimeoutMs,
    ...(d.gcGraceMs === undefined ? {} : { gcGraceMs: d.gcGraceMs }),
    connectTimeoutMs: d.connectTimeoutMs,
    requestTimeoutMs: d.requestTimeoutMs,
  }, { signal: options.interrupt ?? options.signal });
  return {
    backend,
    where: `k8s ${backend.server} (${backend.resource}, namespace ${backend.namespace})`,
    close: () => backend.close(),
  };
}

/** Damage only a Kubernetes store can hold, each with what it means (see `./doctor.ts`). */
export const K8S_DAMAGE_KINDS: Readonly<Record<string, string>> = {
  "key-duplicate": "a second identity of a key (Cilium's agents take no lock); the oldest stays",
  "claim-stale": "a key claim whose identity is gone or carries another key",
  "claim-undecodable": "a key claim Lease that names no key or no ID",
  "node-lease-undecodable": "a node Lease without an epoch or an end",
};

/** The Kubernetes error classes, by name: what to do about them in the CLI's flags. */
export const K8S_FAILURES: Readonly<Record<string, DriverFailure>> = {
  // The message names the CRD to install; the hint adds the flag that names another one.
  ResourceNotInstalledError: {
    kind: "usage",
    hint: () => "or name an installed identity resource with --prefix",
  },
  NotIdentityResourceError: {
    kind: "usage",
    hint: () => "give it as --prefix <plural>.<group>/<version> (and --kind)",
  },
  NotKubernetesApiError: {
    kind: "usage",
    hint: () => "check the server of the kubeconfig's context (or --context)",
  },
  // The message names the verb, the resource and the RBAC rule to add (401: the credentials).
  StoreAccessDeniedError: {
    kind: "usage",
    hint: () => "check the user of the kubeconfig's context (or --context) and its RBAC rules",
  },
  StoreTlsError: {
    kind: "usage",
    hint: () =>
      "check the kubeconfig's certificate-authority (-data) and client certificate for this server",
  },
  // Each names the namespace(s) and the fix in its message.
  NamespaceNotFoundError: { kind: "usage" },
  CoordinationNamespaceError: { kind: "usage" },
  ClockSkewError: { kind: "usage" },
  CredentialPluginError: {
    kind: "usage",
    hint: () =>
      "check the exec plugin of the kubeconfig's user: installed, logged in, and runs without a terminal",
  },
  StoreHostNotFoundError: { kind: "unavailable" },
  StoreConnectionRefusedError: {
    kind: "unavailable",
    hint: () => "check that the API server runs at the kubeconfig's server address",
  },
};

/** The Kubernetes backend, as idalloc's tools know it. */
export const k8sDriver: BackendDriver<K8sStoreDescription> = {
  kind: "k8s",
  folder: new URL("./", import.meta.url).href,
  title: "Kubernetes",
  scheme: "k8s:",
  syntax: `k8s:<kubeconfig> or k8s:${IN_CLUSTER}`,
  exampleStore: "k8s:./kubeconfig",
  prefixSyntax:
    'an identity resource <plural>.<group>/<version> (default "ciliumidentities.cilium.io/v2")',
  options: K8S_OPTIONS,
  description: k8sStoreDescription,
  damageKinds: K8S_DAMAGE_KINDS,
  failures: K8S_FAILURES,
  accepts: (rest) => !rest.includes("\0"),
  describe: describeK8sStore,
  open,
};
