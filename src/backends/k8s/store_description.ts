/**
 * A Kubernetes store as idalloc's tools name it: `--store k8s:<kubeconfig file>` (`k8s:` alone:
 * `$KUBECONFIG`, else `~/.kube/config`) or `k8s:in-cluster` (the pod's service account),
 * `--prefix` as the identity resource `<plural>.<group>/<version>`, and the backend's own options:
 * `--context`, `--namespace` (the coordination namespace, of the node Leases and key claims), `--kind`, `--heartbeat-timeout`
 * and `--clock-skew` (shared with Deno KV, which also judges leases by the nodes' clocks). {@linkcode describeK8sStore} turns them into a
 * {@linkcode K8sStoreDescription}, which `./driver.ts` opens. Nothing here loads the client.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { describeK8sStore } from "./store_description.ts";
 * const d = describeK8sStore("in-cluster", { namespace: "kube-system" }, {
 *   timeoutMs: 30_000,
 *   leaseTtlMs: 60_000,
 * });
 * assert.equal(d.inCluster, true);
 * assert.deepEqual(d.resource, {
 *   group: "cilium.io",
 *   version: "v2",
 *   plural: "ciliumidentities",
 *   kind: "CiliumIdentity",
 * });
 * ```
 *
 * @module
 */
import { resolve } from "node:path";
import { z } from "../../deps/zod.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { StoreContext, StoreOption } from "../driver.ts";
import { durationFlag, formatDuration, validateFlags } from "../driver_options.ts";
import { DEFAULT_NAMESPACE } from "./coordination.ts";
import { DNS_LABEL, isSubdomain } from "./layout.ts";
import { CILIUM_HEARTBEAT_TIMEOUT_MS } from "./limits.ts";

/** `--store k8s:in-cluster`. */
export const IN_CLUSTER = "in-cluster";

/** The identity resource when `--prefix` is not given. */
export const DEFAULT_K8S_PREFIX = "ciliumidentities.cilium.io/v2";

/** How long connecting waits for the API server (at most `--timeout`). */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;

/** One Kubernetes store, completely: how to reach the API server, and what idalloc uses there. */
export interface K8sStoreDescription {
  /**
   * The kubeconfig file (absolute); absent with `inCluster`, and for kubectl's default
   * (`$KUBECONFIG`'s files merged, else `~/.kube/config`).
   */
  readonly kubeconfig?: string;
  /** Whether the pod's service account is used instead of a kubeconfig. */
  readonly inCluster: boolean;
  /** The kubeconfig context; its current one when absent. */
  readonly context?: string;
  /** The coordination namespace (of node Leases and claims); the backend's default when absent. */
  readonly namespace?: string;
  /** The identity resource. */
  readonly resource: {
    readonly group: string;
    readonly version: string;
    readonly plural: string;
    readonly kind: string;
  };
  /** The largest clock difference between nodes, in ms. */
  readonly maxClockSkewMs: number;
  /** Cilium operator's heartbeat timeout, in ms. */
  readonly heartbeatTimeoutMs: number;
  /** GC's and the doctor's grace for new or freshly marked identities; the timeout when absent. */
  readonly gcGraceMs?: number;
  /** How long connecting waits for the API server, in ms. */
  readonly connectTimeoutMs: number;
  /** Upper bound of one request, in ms. */
  readonly requestTimeoutMs: number;
}

/** The schema of {@linkcode K8sStoreDescription}. */
export const k8sStoreDescription: z.ZodType<K8sStoreDescription> = z.object({
  kubeconfig: z.string().min(1).optional(),
  inCluster: z.boolean(),
  context: z.string().min(1).optional(),
  namespace: z.string().regex(DNS_LABEL).max(63).optional(),
  resource: z.object({
    group: z.string().refine(isSubdomain),
    version: z.string().regex(DNS_LABEL),
    plural: z.string().regex(DNS_LABEL),
    kind: z.string().regex(/^[A-Z][A-Za-z0-9]*$/),
  }).strict(),
  maxClockSkewMs: z.number().int().min(0),
  heartbeatTimeoutMs: z.number().int().min(1_000),
  gcGraceMs: z.number().int().min(0).optional(),
  connectTimeoutMs: z.number().int().positive(),
  requestTimeoutMs: z.number().int().positive(),
}).strict().refine((d) => !(d.inCluster && d.kubeconfig !== undefined), {
  message: "in-cluster configuration takes no kubeconfig",
});

/** The backend's own CLI options. */
export const K8S_OPTIONS: readonly StoreOption[] = [
  { flags: "--context <name>", description: "kubeconfig context (default: its current one)" },
  {
    flags: "--namespace <name>",
    description:
      "coordination namespace: of the node Leases and key claims, the same for every node and " +
      "tool of the store (never the context's)",
    default: DEFAULT_NAMESPACE,
  },
  {
    flags: "--kind <kind>",
    description: "kind of the identity resource's objects",
    default: "CiliumIdentity",
  },
  {
    flags: "--heartbeat-timeout <duration>",
    description: "Cilium operator's --identity-heartbeat-timeout",
    default: "30m",
  },
  {
    flags: "--gc-grace <duration>",
    description:
      "how long gc and doctor keep an identity created or marked unused less than that ago " +
      "(0s: not at all; default: --heartbeat-timeout)",
  },
  // Deno KV declares it too (the CLI declares a shared option once): the same flag, both stores.
  {
    flags: "--clock-skew <duration>",
    description: "largest clock difference between nodes",
    default: "5s",
  },
];

const k8sValues = z.object({
  context: z.string().min(1).optional(),
  namespace: z.string().max(63).regex(DNS_LABEL, "must be a namespace name").optional(),
  kind: z.string().regex(/^[A-Z][A-Za-z0-9]*$/, "must be a kind (CamelCase)").default(
    "CiliumIdentity",
  ),
  heartbeatTimeout: durationFlag(1_000).default(CILIUM_HEARTBEAT_TIMEOUT_MS),
  gcGrace: durationFlag(0).optional(),
  clockSkew: durationFlag(0).default(5_000),
});

/** `<plural>.<group>/<version>` of `--prefix`, or `undefined` when it is not that. */
export function k8sResource(
  prefix: string,
): { group: string; version: string; plural: string } | undefined {
  const match = /^([a-z0-9-]+)\.([a-z0-9.-]+)\/([a-z0-9-]+)$/.exec(prefix);
  if (match === null) return undefined;
  const [, plural, group, version] = match;
  if (!DNS_LABEL.test(plural) || !isSubdomain(group) || !DNS_LABEL.test(version)) return undefined;
  return { group, version, plural };
}

/**
 * The description of `--store k8s:<rest>` with `--prefix` and the backend's options; throws
 * `InvalidOptionsError` naming the flag.
 */
export function describeK8sStore(
  rest: string,
  values: Readonly<Record<string, unknown>>,
  context: StoreContext,
): K8sStoreDescription {
  const o = validateFlags(k8sValues, values);
  const inCluster = rest === IN_CLUSTER;
  if (inCluster && o.context !== undefined) {
    throw new InvalidOptionsError(
      "invalid option: --context names a kubeconfig context; --store k8s:in-cluster has none",
    );
  }
  if (context.leaseTtlMs < 2 * o.clockSkew) {
    // Leases are judged with the skew margin on both sides (`liveness.ts`).
    throw new InvalidOptionsError(
      `invalid option: --lease-ttl (${formatDuration(context.leaseTtlMs)}) must be at least ` +
        `twice --clock-skew (${formatDuration(o.clockSkew)}) on Kubernetes`,
    );
  }
  const prefix = context.prefix ?? DEFAULT_K8S_PREFIX;
  const resource = k8sResource(prefix);
  if (resource === undefined) {
    throw new InvalidOptionsError(
      `invalid option: --prefix '${prefix}' must name the identity resource as ` +
        "<plural>.<group>/<version>, e.g. ciliumidentities.cilium.io/v2",
    );
  }
  return {
    // `k8s:` alone: the kubeconfig kubectl would use, found when the store is opened.
    ...(inCluster || rest === "" ? {} : { kubeconfig: resolve(rest) }),
    inCluster,
    ...(o.context === undefined ? {} : { context: o.context }),
    ...(o.namespace === undefined ? {} : { namespace: o.namespace }),
    resource: { ...resource, kind: o.kind },
    maxClockSkewMs: o.clockSkew,
    heartbeatTimeoutMs: o.heartbeatTimeout,
    ...(o.gcGrace === undefined ? {} : { gcGraceMs: o.gcGrace }),
    // Connecting answers within 5s (at most --timeout); a request may take --timeout.
    connectTimeoutMs: Math.min(DEFAULT_CONNECT_TIMEOUT_MS, context.timeoutMs),
    requestTimeoutMs: context.timeoutMs,
  };
}
