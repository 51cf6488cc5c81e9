/**
 * Options of the Kubernetes backend: public types, and their validation (zod). Each option is
 * declared once, in the schema; the documented {@linkcode K8sBackendOptions} is checked against it
 * at compile time (see `src/option_shape.ts`).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { resolveK8sOptions } from "./options.ts";
 * const settings = resolveK8sOptions({ node: "10.0.0.1" });
 * assert.equal(settings.resource.plural, "ciliumidentities");
 * assert.equal(settings.heartbeatTimeoutMs, 30 * 60_000);
 * assert.throws(() => resolveK8sOptions({ node: "a/b" }), { name: "InvalidOptionsError" });
 * ```
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { SameShape, SettingsOf } from "../../option_shape.ts";
import { parseOptions } from "../../validate.ts";
import { DEFAULT_NAMESPACE } from "./coordination.ts";
import { DNS_LABEL, isNodeName, isSubdomain } from "./layout.ts";
import { CILIUM_HEARTBEAT_TIMEOUT_MS } from "./limits.ts";

/** The identity resource (a CRD with Cilium's `CiliumIdentity` schema). */
export interface K8sResourceOptions {
  /** API group. @default {"cilium.io"} */
  readonly group?: string;
  /** API version. @default {"v2"} */
  readonly version?: string;
  /** Plural resource name. @default {"ciliumidentities"} */
  readonly plural?: string;
  /** The kind of its objects. @default {"CiliumIdentity"} */
  readonly kind?: string;
}

/** The resource of Cilium's endpoints (`CiliumEndpoint`), which keep identities alive for GC. */
export interface K8sEndpointResourceOptions {
  /** API group. @default {the identity resource's group} */
  readonly group?: string;
  /** API version. @default {the identity resource's version} */
  readonly version?: string;
  /** Plural resource name. @default {"ciliumendpoints"} */
  readonly plural?: string;
}

/** The resource of Cilium's endpoint slices (`CiliumEndpointSlice`, clusters with CES enabled). */
export interface K8sEndpointSliceResourceOptions {
  /** API group. @default {the identity resource's group} */
  readonly group?: string;
  /** API version. @default {"v2alpha1"} */
  readonly version?: string;
  /** Plural resource name. @default {"ciliumendpointslices"} */
  readonly plural?: string;
}

/** Options of {@linkcode K8sBackend.connect}. */
export interface K8sBackendOptions {
  /**
   * This node's name. It names the node's references (`ref.idalloc.io/<node>` annotations), so
   * it must be a Kubernetes annotation name part: at most 63 characters of `[A-Za-z0-9-_.]`,
   * starting and ending with a letter or digit (a host name or an IP address fits).
   */
  readonly node: string;
  /**
   * The coordination namespace: where the node Leases and key claims of this identity store live.
   * Every idalloc node and tool of one store must use the same one; it does not depend on the
   * kubeconfig context or the pod, and the identities idalloc references record it, so a caller
   * configured with another is refused (`CoordinationNamespaceError`). It must exist
   * (`NamespaceNotFoundError` otherwise). @default {"idalloc-system"}
   */
  readonly namespace?: string;
  /** The identity resource. @default {Cilium's `ciliumidentities.cilium.io/v2`} */
  readonly resource?: K8sResourceOptions;
  /**
   * The endpoint resource GC reads (an identity a `CiliumEndpoint` names is in use), or `false`
   * when no Cilium runs beside idalloc. A resource that is not installed counts as none.
   * @default {`ciliumendpoints` of the identity resource's group and version}
   */
  readonly endpoints?: K8sEndpointResourceOptions | false;
  /**
   * The endpoint-slice resource GC and the doctor read (an identity that an entry of a
   * `CiliumEndpointSlice` names, `endpoints[].id`, is in use, as Cilium's operator counts it with
   * CES enabled), or `false`. A resource that is not installed counts as none.
   * @default {`ciliumendpointslices` of the identity resource's group, `v2alpha1`; off when
   * `endpoints` is `false`}
   */
  readonly endpointSlices?: K8sEndpointSliceResourceOptions | false;
  /**
   * Cilium operator's `--identity-heartbeat-timeout`: how long an identity it marked unused stays
   * before it deletes it. idalloc removes the mark from the identities it holds at once and at
   * every lease renewal, so the lease's renewal (a third of its TTL) must come well within it.
   * It is also this store's default GC grace (`gcGraceMs`): idalloc's GC keeps an identity
   * created or marked unused less than that ago, as Cilium's operator does. @default {1800000}
   */
  readonly heartbeatTimeoutMs?: number;
  /**
   * How long GC and the doctor keep an identity created or marked unused less than that ago:
   * this store's default GC grace (`K8sBackend.defaultGcGraceMs`; an allocator's own
   * `gcGraceMs` overrides it). 0 turns that part of the rule off (where no Cilium agent creates
   * identities, or in tests). @default {heartbeatTimeoutMs}
   */
  readonly gcGraceMs?: number;
  /**
   * The largest difference between two nodes' clocks, in ms. Lease expiry is judged with this
   * margin (a Lease's `renewTime` is its holder's clock), and a lease is never renewed this close
   * to its expiry. @default {5000}
   */
  readonly maxClockSkewMs?: number;
  /** A kubeconfig file. @default {`$KUBECONFIG`, else `~/.kube/config`} */
  readonly kubeconfig?: string;
  /** The kubeconfig context to use. @default {the kubeconfig's current context} */
  readonly context?: string;
  /** Use the pod's service account (in-cluster configuration) instead of a kubeconfig. */
  readonly inCluster?: boolean;
  /** How long `connect` waits for the API server, in ms. @default {5000} */
  readonly connectTimeoutMs?: number;
  /** Upper bound of one request, in ms. @default {10000} */
  readonly requestTimeoutMs?: number;
  /** The clock, in ms since the epoch (injected by tests). @default {Date.now} */
  readonly now?: () => number;
}

const subdomain = z.string().refine(isSubdomain, "must be a DNS subdomain (lowercase a-z0-9-.)");
const dnsLabel = z.string().max(63).regex(DNS_LABEL, "must be a DNS label (lowercase a-z0-9-)");

const schema = z.object({
  node: z.string().min(1).refine(
    isNodeName,
    "must be a Kubernetes annotation name part: at most 63 characters of [A-Za-z0-9-_.], " +
      "starting and ending with a letter or digit",
  ),
  namespace: dnsLabel.default(DEFAULT_NAMESPACE),
  resource: z.object({
    group: subdomain.default("cilium.io"),
    version: dnsLabel.default("v2"),
    plural: dnsLabel.default("ciliumidentities"),
    kind: z.string().regex(/^[A-Z][A-Za-z0-9]*$/, "must be a kind (CamelCase)")
      .default("CiliumIdentity"),
  }).strict().prefault({}),
  endpoints: z.union([
    z.literal(false),
    z.object({
      group: subdomain.optional(),
      version: dnsLabel.optional(),
      plural: dnsLabel.default("ciliumendpoints"),
    }).strict(),
  ]).prefault({}),
  endpointSlices: z.union([
    z.literal(false),
    z.object({
      group: subdomain.optional(),
      version: dnsLabel.default("v2alpha1"),
      plural: dnsLabel.default("ciliumendpointslices"),
    }).strict(),
  ]).optional(),
  heartbeatTimeoutMs: z.number().int().min(1_000).default(CILIUM_HEARTBEAT_TIMEOUT_MS),
  gcGraceMs: z.number().int().nonnegative().max(86_400_000).optional(),
  maxClockSkewMs: z.number().int().nonnegative().default(5_000),
  kubeconfig: z.string().min(1).optional(),
  context: z.string().min(1).optional(),
  inCluster: z.boolean().optional(),
  connectTimeoutMs: z.number().int().min(1).max(600_000).default(5_000),
  requestTimeoutMs: z.number().int().min(1).max(600_000).default(10_000),
  now: z.custom<() => number>((v) => typeof v === "function", "must be a function")
    .default(() => Date.now),
}).strict()
  .refine((o) => !(o.inCluster && (o.kubeconfig !== undefined || o.context !== undefined)), {
    message: "in-cluster configuration takes no kubeconfig or context",
    path: ["inCluster"],
  });

/** Options after validation, with defaults: the schema's output, so declared once. */
export type K8sSettings = SettingsOf<typeof schema>;

// Does not compile when the documented options and the schema drift apart.
const _documentedAsValidated: SameShape<K8sBackendOptions, z.input<typeof schema>> = true;

/** Validates `options`; throws {@linkcode InvalidOptionsError} naming every problem. */
export function resolveK8sOptions(options: K8sBackendOptions): K8sSettings {
  return parseOptions(schema, options, "Kubernetes backend options");
}

/**
 * Checks what only opening a session can (the lease TTL is the allocator's): the TTL leaves room
 * for the skew margin at both ends (as on Deno KV), and renewal, every third of it, comes within a
 * third of Cilium operator's heartbeat timeout, so a mark on a held identity is removed in time.
 */
export function checkLeaseTtl(settings: K8sSettings, leaseTtlMs: number): void {
  const skew = settings.maxClockSkewMs;
  if (!Number.isSafeInteger(leaseTtlMs) || leaseTtlMs <= 0 || leaseTtlMs < 2 * skew) {
    throw new InvalidOptionsError(
      `Cannot open Kubernetes session as 'leaseTtlMs' must be a positive integer of at least ` +
        `2 × maxClockSkewMs (${2 * skew}): current value is ${leaseTtlMs}`,
    );
  }
  if (leaseTtlMs >= settings.heartbeatTimeoutMs) {
    throw new InvalidOptionsError(
      `Cannot open Kubernetes session as 'leaseTtlMs' (${leaseTtlMs}) must be below ` +
        `heartbeatTimeoutMs (${settings.heartbeatTimeoutMs}): the renewal every third of it ` +
        "is when held identities lose Cilium operator's mark, which must come within a third of " +
        "the heartbeat timeout",
    );
  }
}

/** The identity resource of `settings`, as the client names resources. */
export function identityResource(settings: K8sSettings): {
  readonly group: string;
  readonly version: string;
  readonly plural: string;
  readonly namespaced: false;
} {
  const { group, version, plural } = settings.resource;
  return { group, version, plural, namespaced: false };
}

/** The endpoint resource of `settings`, or `undefined` when GC must not read endpoints. */
export function endpointResource(settings: K8sSettings): {
  readonly group: string;
  readonly version: string;
  readonly plural: string;
  readonly namespaced: true;
} | undefined {
  const e = settings.endpoints;
  if (e === false) return undefined;
  return {
    group: e.group ?? settings.resource.group,
    version: e.version ?? settings.resource.version,
    plural: e.plural,
    namespaced: true,
  };
}

/**
 * The endpoint-slice resource of `settings` (cluster-scoped), or `undefined` when GC must not read
 * endpoint slices (off, or not given while `endpoints` is off).
 */
export function endpointSliceResource(settings: K8sSettings): {
  readonly group: string;
  readonly version: string;
  readonly plural: string;
  readonly namespaced: false;
} | undefined {
  const given = settings.endpointSlices;
  if (given === false || (given === undefined && settings.endpoints === false)) return undefined;
  const s: { group?: string; version?: string; plural?: string } = given ?? {};
  return {
    group: s.group ?? settings.resource.group,
    version: s.version ?? "v2alpha1",
    plural: s.plural ?? "ciliumendpointslices",
    namespaced: false,
  };
}

/** The store's GC grace: `gcGraceMs`, else Cilium operator's heartbeat timeout. */
export function storeGraceMs(settings: K8sSettings): number {
  return settings.gcGraceMs ?? settings.heartbeatTimeoutMs;
}

/** The node and claim Leases' resource (`coordination.k8s.io/v1` `leases`). */
export const LEASES = {
  group: "coordination.k8s.io",
  version: "v1",
  plural: "leases",
  namespaced: true,
} as const;

/** `<plural>.<group>`: how people (`kubectl get`) and the admin name the identity resource. */
export function resourceName(settings: K8sSettings): string {
  return `${settings.resource.plural}.${settings.resource.group}`;
}
