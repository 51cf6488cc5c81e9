/**
 * Every metric and span idalloc records, as data: the instruments are created from it,
 * `docs/observability.md` lists it (a test keeps the two in step), and `idalloc status` names its counters after it.
 *
 * Names follow the OpenTelemetry semantic-convention style (`idalloc.…`, dot-separated, units in
 * UCUM: `s`, `{allocation}`); a Prometheus exporter turns `idalloc.store.operations` with unit
 * `{operation}` into `idalloc_store_operations_total`.
 *
 * @example The names of the counters
 * ```ts
 * import assert from "node:assert/strict";
 * import { METRICS } from "./catalog.ts";
 * const counters = METRICS.filter((m) => m.kind === "counter").map((m) => m.name);
 * assert.ok(counters.includes("idalloc.releases"));
 * ```
 *
 * @module
 */

/** Attribute names idalloc puts on its metrics and spans. */
export const ATTR = {
  /** Backend kind: `deno-kv`, `etcd` or `k8s`. */
  backend: "idalloc.backend",
  /**
   * The store namespace: Deno KV `idalloc/demo`, etcd `cilium/state/identities/v1`, Kubernetes
   * `ciliumidentities.cilium.io/v2`.
   */
  prefix: "idalloc.prefix",
  /** The node name of the allocator or backend. */
  node: "idalloc.node",
  /** What came of the operation (see each metric). */
  outcome: "idalloc.outcome",
  /** The error's class name (`StoreUnavailableError`, `ConflictError`, `TimeoutError`, …). */
  errorType: "error.type",
  /**
   * The store operation: etcd `acquire`, `read references`, `gc delete`, …; Deno KV `commit`,
   * `read`, `list`; Kubernetes `<verb> <plural>` (`create ciliumidentities`, `patch leases`, …).
   */
  operation: "idalloc.store.operation",
  /** What a GC pass did with an ID: `marked`, `deleted`, `skipped`. */
  gcResult: "idalloc.gc.result",
  /** Why the watch re-listed: `initial`, `resync`, `missed`, `compacted`, `counter`, `expired`. */
  reason: "idalloc.reason",
  /** Identity scope: `reserved`, `global`, `local`, `remote-node`, `remote-cluster`. */
  scope: "idalloc.identity.scope",
  /** A remote cluster's name (identities of scope `remote-cluster`). */
  cluster: "idalloc.cluster",
} as const;

/** Instrument kinds idalloc uses. */
export type MetricKind =
  | "counter"
  | "histogram"
  | "observable-counter"
  | "observable-gauge";

/** One metric of the catalog. */
export interface MetricSpec {
  /** Its name. */
  readonly name: string;
  /** Its kind of instrument. */
  readonly kind: MetricKind;
  /** UCUM unit. */
  readonly unit: string;
  /** Attributes besides `idalloc.backend`, `idalloc.prefix`, `idalloc.node` (which all carry). */
  readonly attributes: readonly string[];
  /** What it counts or measures. */
  readonly description: string;
  /** Histogram bucket boundaries (advice to the SDK). */
  readonly buckets?: readonly number[];
}

/** Latency buckets in seconds: 0.5 ms to 10 s. */
const SECONDS = [
  0.0005,
  0.001,
  0.0025,
  0.005,
  0.01,
  0.025,
  0.05,
  0.1,
  0.25,
  0.5,
  1,
  2.5,
  5,
  10,
];

function spec(
  name: string,
  kind: MetricKind,
  unit: string,
  attributes: readonly string[],
  description: string,
  buckets?: readonly number[],
): MetricSpec {
  return Object.freeze({ name, kind, unit, attributes, description, buckets });
}

const O = ATTR.outcome;
const E = ATTR.errorType;

/** Every metric, in the order `docs/observability.md` lists them. */
export const METRICS: readonly MetricSpec[] = Object.freeze([
  spec(
    "idalloc.allocations",
    "observable-counter",
    "{allocation}",
    [O, E],
    "`allocate` calls by outcome: `new` (this call created the ID), `existing` (the store had it), " +
      "`cached` (held here: no store access), `failed` (with `error.type`)",
  ),
  spec(
    "idalloc.allocation.duration",
    "histogram",
    "s",
    [O, E],
    "time of an `allocate` that went to the store (`new`, `existing`, `failed`), retries included",
    SECONDS,
  ),
  spec(
    "idalloc.allocation.round_trips",
    "histogram",
    "{round_trip}",
    [O],
    "store round trips one such `allocate` took (a shared group commit counts once for each member)",
    [1, 2, 3, 4, 6, 8, 12, 16, 32],
  ),
  spec(
    "idalloc.allocation.retries",
    "counter",
    "{retry}",
    [E],
    "attempts of `allocate` that failed and were retried, by cause (`ConflictError`, " +
      "`StoreUnavailableError`, `KeyLockedError` waits, `PoolExhaustedError`)",
  ),
  spec(
    "idalloc.releases",
    "counter",
    "{release}",
    [O, E],
    "`release` calls: `last_use` (the reference was deleted), `held` (other local uses remain), " +
      "`deferred` (the delete failed; the sync retries it), `failed`",
  ),
  spec(
    "idalloc.release.duration",
    "histogram",
    "s",
    [O],
    "time of a `release`",
    SECONDS,
  ),
  spec(
    "idalloc.store.operations",
    "counter",
    "{operation}",
    [ATTR.operation, O, E],
    "store round trips by operation and outcome: `ok`, `check_failed` (a guarded write whose " +
      "check or compare failed: a lost race), `cancelled`, `error` (with `error.type`)",
  ),
  spec(
    "idalloc.store.operation.duration",
    "histogram",
    "s",
    [ATTR.operation, O],
    "time of one store operation (etcd: retries on other members included)",
    SECONDS,
  ),
  spec(
    "idalloc.store.retries",
    "counter",
    "{retry}",
    [ATTR.operation, E],
    "store requests retried inside one operation (etcd: a transient failure, another member; " +
      "Deno KV: the database file was busy)",
  ),
  spec(
    "idalloc.store.batch.size",
    "histogram",
    "{operation}",
    [ATTR.operation],
    "operations one store request carried (group commit; 1 when it went alone)",
    [1, 2, 4, 8, 16, 32, 64],
  ),
  spec(
    "idalloc.cache.ids",
    "observable-gauge",
    "{id}",
    [],
    "IDs in the watch-fed cache",
  ),
  spec(
    "idalloc.keys.held",
    "observable-gauge",
    "{key}",
    [],
    "keys this node holds (references it keeps alive)",
  ),
  spec(
    "idalloc.ids.free",
    "observable-gauge",
    "{id}",
    [],
    "free IDs in the allocator's range, as far as the cache knows",
  ),
  spec(
    "idalloc.subscriber.queue",
    "observable-gauge",
    "{event}",
    [],
    "events waiting in `watch()` consumers' queues (a slow consumer shows here)",
  ),
  spec(
    "idalloc.healthy",
    "observable-gauge",
    "1",
    [],
    "1 while the allocator reaches the store and can prove its claims (`status().healthy`), else 0",
  ),
  spec(
    "idalloc.watch.lag",
    "histogram",
    "s",
    [],
    "age of a store change when the cache applied it (Deno KV: since the writer stamped it; " +
      "etcd, Kubernetes: since its watch response arrived)",
    SECONDS,
  ),
  spec(
    "idalloc.watch.relists",
    "counter",
    "{relist}",
    [ATTR.reason],
    "full lists of the masters: `initial`, `resync` (Deno KV's safety net), `missed` " +
      "(change-feed entries missing), `counter` (change counter reset or damaged), `compacted` " +
      "(etcd), `expired` (Kubernetes: 410 Gone)",
  ),
  spec(
    "idalloc.watch.reconnects",
    "counter",
    "{reconnect}",
    [E],
    "watches that failed and were resumed (etcd: the stream broke; Deno KV: a poll failed; " +
      "Kubernetes: a list or watch request failed)",
  ),
  spec(
    "idalloc.gc.runs",
    "counter",
    "{run}",
    [O, E],
    "GC passes: `ok` or `failed`",
  ),
  spec(
    "idalloc.gc.ids",
    "counter",
    "{id}",
    [ATTR.gcResult],
    "what GC passes did with IDs: `marked` (unused, deleted next pass if still so), `deleted`, " +
      "`skipped` (damaged entries left alone)",
  ),
  spec(
    "idalloc.gc.duration",
    "histogram",
    "s",
    [O],
    "time of one GC pass",
    SECONDS,
  ),
  spec(
    "idalloc.lease.renewals",
    "counter",
    "{renewal}",
    [O, E],
    "lease renewals confirmed by the store (`ok`) or failed (`failed`)",
  ),
  spec(
    "idalloc.lease.lapses",
    "observable-counter",
    "{lapse}",
    [],
    "times the node's lease ran out before it could be renewed (the node was fenced)",
  ),
  spec(
    "idalloc.lease.replacements",
    "observable-counter",
    "{replacement}",
    [],
    "times the lease was lost and replaced by a new one (its references were re-created)",
  ),
  spec(
    "idalloc.fence.conflicts",
    "observable-counter",
    "{conflict}",
    [],
    "times the store showed a held key's ID under another key, or the key under another ID",
  ),
  spec(
    "idalloc.keys.reassigned",
    "observable-counter",
    "{key}",
    [],
    "held keys that lost their ID while fenced and were re-acquired under a new one",
  ),
  spec(
    "idalloc.keys.fenced",
    "observable-gauge",
    "{key}",
    [],
    "held keys not answered from memory right now (under re-check)",
  ),
  ...(["kvstore", "crd"] as const).flatMap((side) => [
    spec(
      `idalloc.identity.${side}.total_count`,
      "observable-gauge",
      "{identity}",
      [],
      `double-write modes: identities on the ${side === "crd" ? "CRD" : "kvstore"} side, as a ` +
        `writable session's watches see them (Cilium operator's ` +
        `\`cilium_operator_identity_${side}_total_count\`)`,
    ),
    spec(
      `idalloc.identity.${side}.only_count`,
      "observable-gauge",
      "{identity}",
      [],
      `double-write modes: identities whose ID only the ${
        side === "crd" ? "CRD" : "kvstore"
      } side has (Cilium operator's \`cilium_operator_identity_${side}_only_count\`; 0 on the ` +
        "side being left ends a migration step)",
    ),
  ]),
  spec(
    "idalloc.identity.differing_count",
    "observable-gauge",
    "{identity}",
    [],
    "double-write modes: IDs whose two sides name different label sets (no counter of Cilium's " +
      "shows these; `idalloc doctor` lists them)",
  ),
  spec(
    "idalloc.identities",
    "observable-gauge",
    "{identity}",
    [ATTR.scope, ATTR.cluster],
    "identities an `IdentityAllocator` knows, by scope: `reserved`, `global` (this cluster's, " +
      "cached), `local`, `remote-node`, `remote-cluster` (with `idalloc.cluster`)",
  ),
]);

/** One span of the catalog. */
export interface SpanSpec {
  /** Its name. */
  readonly name: string;
  /** Attributes besides backend, prefix and node. */
  readonly attributes: readonly string[];
  /** When it is recorded. */
  readonly description: string;
}

/** Every span, in the order `docs/observability.md` lists them. */
export const SPANS: readonly SpanSpec[] = Object.freeze([
  {
    name: "idalloc.allocate",
    attributes: [O, E, "idalloc.id"],
    description: "an `allocate` that goes to the store (never a cached hit)",
  },
  {
    name: "idalloc.release",
    attributes: [O, E],
    description: "a `release`",
  },
  {
    name: "idalloc.gc",
    attributes: [O, E, "idalloc.gc.deleted", "idalloc.gc.marked", "idalloc.gc.skipped"],
    description: "one GC pass (`runGc`, the periodic GC)",
  },
  {
    name: "idalloc.sync",
    attributes: [O, E, ATTR.reason, "idalloc.keys"],
    description: "a re-check of every held key (`sync`, the periodic sync, a fence re-check)",
  },
  {
    name: "idalloc.initial_sync",
    attributes: [O],
    description: "from `Allocator.open` until the cache holds the store's initial list",
  },
  {
    name: "<backend> <operation>",
    attributes: [ATTR.operation, O, E],
    description: "each store round trip made inside one of the spans above, as its child: " +
      "`etcd acquire`, `etcd read references`, `deno-kv commit`, `deno-kv read`, …",
  },
]);
