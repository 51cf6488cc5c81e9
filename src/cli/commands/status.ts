/**
 * `status`: is the store reachable and how fast does it answer, how many IDs are stored, which
 * nodes hold a lease, how many IDs are in use, and which keys are split — keys whose live
 * references name different IDs, a state only another writer (e.g. a Cilium agent) can make and an
 * operator must repair. Everything beyond the first read comes from one pass over the masters and
 * one over the references, through the backend's admin surface.
 *
 * @module
 */
import { type SplitKey, splitKeys } from "../../allocator/admin.ts";
import type {
  BackendSession,
  NodeLease,
  SessionStatus,
  StoredReference,
} from "../../allocator/backend.ts";
import type { RunContext } from "../context.ts";
import { type DriftCount, identityDrift } from "../../backends/doublewrite/mod.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import { listMasters, noteIfEmpty, pause, plural, printable } from "./common.ts";
import { readReferences } from "./refs.ts";

/** Options of `status`. */
export interface StatusCommandOptions {
  /** Accepted for scripts written before usage was always shown. */
  readonly usage: boolean;
}

/** How long `status` waits for the store's leader to be known. */
const LEADER_WAIT_MS = 1_000;

/** How many stored IDs live references use. */
export interface Usage {
  readonly inUse: number;
  readonly unused: number;
}

async function sessionStatus(ctx: RunContext, session: BackendSession): Promise<SessionStatus> {
  let status = session.status();
  // A store of network members looks its leader up in the background when the session opens;
  // give it a moment (an embedded store has endpoints that are no URLs, and no leader).
  const members = status.endpoints.some((e) => e.includes("://"));
  for (let waited = 0; members && status.leader === undefined; waited += 50) {
    if (waited >= LEADER_WAIT_MS) break;
    await pause(50, ctx.signal);
    status = session.status();
  }
  return status;
}

function inSeconds(ms: number): string {
  const s = Math.round(ms / 1000);
  return s >= 0 ? `in ${s}s` : `${-s}s ago`;
}

function describeLease(lease: StatusModel["nodes"][number], now: number): string {
  const state = lease.live ? "live" : "lapsed";
  if (lease.expiresAt === null) return `${lease.node}: ${state}`;
  return `${lease.node}: ${state}, lease ends ${inSeconds(Date.parse(lease.expiresAt) - now)}`;
}

/** The counters `status` shares with an allocator's metrics, under the metrics' names. */
export interface StatusMetrics {
  /** Free IDs in `--min`…`--max`. */
  readonly "idalloc.ids.free": number;
  /** Keys each node holds (its live references). */
  readonly "idalloc.keys.held": Record<string, number>;
  /** Whether the store answered healthily. */
  readonly "idalloc.healthy": 0 | 1;
  /** The first read's latency, in seconds. */
  readonly "idalloc.store.operation.duration": number;
  /** Double-write modes: identities on the kvstore side (Cilium's `…_kvstore_total_count`). */
  readonly "idalloc.identity.kvstore.total_count"?: number;
  /** Double-write modes: identities on the kvstore only (Cilium's `…_kvstore_only_count`). */
  readonly "idalloc.identity.kvstore.only_count"?: number;
  /** Double-write modes: identities on the CRD side (Cilium's `…_crd_total_count`). */
  readonly "idalloc.identity.crd.total_count"?: number;
  /** Double-write modes: identities on the CRDs only (Cilium's `…_crd_only_count`). */
  readonly "idalloc.identity.crd.only_count"?: number;
  /** Double-write modes: IDs whose sides name different label sets. */
  readonly "idalloc.identity.differing_count"?: number;
}

/** The per-side counts under their metrics' names (what a writable session reports). */
function driftMetrics(drift: DriftCount) {
  return {
    "idalloc.identity.kvstore.total_count": drift.kvstore.total,
    "idalloc.identity.kvstore.only_count": drift.kvstore.only,
    "idalloc.identity.crd.total_count": drift.crd.total,
    "idalloc.identity.crd.only_count": drift.crd.only,
    "idalloc.identity.differing_count": drift.differing.length,
  };
}

function metricsOf(
  ids: readonly (readonly [number, string])[],
  references: readonly StoredReference[],
  range: { readonly min: number; readonly max: number },
  healthy: boolean,
  latencyMs: number,
): StatusMetrics {
  const inRange = ids.filter(([id]) => id >= range.min && id <= range.max).length;
  const held: Record<string, number> = {};
  for (const ref of references) if (ref.live) held[ref.node] = (held[ref.node] ?? 0) + 1;
  return {
    "idalloc.ids.free": range.max - range.min + 1 - inRange,
    "idalloc.keys.held": held,
    "idalloc.healthy": healthy ? 1 : 0,
    "idalloc.store.operation.duration": latencyMs / 1000,
  };
}

function describeSplit(split: SplitKey): string {
  const byId = split.ids.map((id) => {
    const nodes = split.references.filter((r) => r.id === id).map((r) => r.node).sort();
    return `ID ${id} (${nodes.join(", ")})`;
  });
  return `${printable(split.key)}: ${byId.join(" vs ")}`;
}

/** What `status` read from the store (its model is computed from this alone). */
export interface StatusReading {
  readonly where: string;
  readonly backend: string;
  readonly prefix: string;
  /** The first read's latency, in ms (one decimal). */
  readonly latencyMs: number;
  readonly health: SessionStatus;
  /** The stored IDs with their keys, ascending. */
  readonly ids: readonly (readonly [number, string])[];
  readonly references: readonly StoredReference[];
  readonly leases: readonly NodeLease[];
  /** Both sides' counts, in a double-write mode. */
  readonly drift?: DriftCount;
}

/** What `status` reports: its `--json` output, and what its table shows. */
export interface StatusModel {
  readonly store: string;
  readonly backend: string;
  readonly prefix: string;
  readonly reachable: true;
  readonly healthy: boolean;
  readonly latencyMs: number;
  readonly leader: string | null;
  readonly lastError: string | null;
  readonly ids: number;
  readonly minId: number | null;
  readonly maxId: number | null;
  readonly nodes: readonly {
    readonly node: string;
    readonly live: boolean;
    /** ISO 8601, `null` when the store cannot tell. */
    readonly expiresAt: string | null;
  }[];
  readonly references: { readonly total: number; readonly live: number };
  readonly usage: Usage;
  readonly splitKeys: readonly SplitKey[];
  readonly metrics: StatusMetrics;
  /**
   * In a double-write mode: identities per side and on one side only (Cilium operator's
   * `cilium_operator_identity_{crd,kvstore}_{total,only}_count`), and IDs whose sides differ.
   */
  readonly doubleWrite?: DriftCount;
}

/** `status`. */
export async function statusCommand(
  ctx: RunContext,
  _options: StatusCommandOptions,
): Promise<number> {
  const reading = await readStatus(ctx);
  const model = statusModel(reading, ctx.options);
  if (ctx.options.json) ctx.output.out.line(JSON.stringify(model));
  else writeTable(ctx.output.out, null, statusRows(model, ctx.options, Date.now()));
  return ExitCode.Ok;
}

/** Times one read, then lists the masters, the references and the node leases. */
async function readStatus(ctx: RunContext): Promise<StatusReading> {
  const store = await ctx.store();
  const session = await store.reader(ctx.signal);
  const started = performance.now();
  await session.getById(1, ctx.signal);
  const latencyMs = Math.round((performance.now() - started) * 10) / 10;
  // The store answered; counting runs as long as it takes.
  ctx.untimed();
  const exists = await noteIfEmpty(ctx, store);
  const progress = ctx.progress();
  // Three independent reads; a store of network members answers them side by side.
  const [ids, references, leases] = exists
    ? await Promise.all([
      listMasters(ctx, session, progress),
      readReferences(ctx, store, progress),
      store.admin.nodeLeases(ctx.signal),
    ])
    : [[], [], []];
  progress.clear();
  const health = await sessionStatus(ctx, session);
  const drift = await identityDrift(store.backend, ctx.signal);
  const { where, kind: backend, prefix } = store;
  return {
    where,
    backend,
    prefix,
    latencyMs,
    health,
    ids,
    references,
    leases,
    ...(drift === undefined ? {} : { drift }),
  };
}

/** The model of what was read; `range` is the allocator's (`--min`, `--max`). */
export function statusModel(
  read: StatusReading,
  range: { readonly min: number; readonly max: number },
): StatusModel {
  const { ids, references, leases, health, latencyMs } = read;
  const liveKeys = new Set(references.filter((r) => r.live).map((r) => r.key));
  const inUse = ids.filter(([, key]) => liveKeys.has(key)).length;
  return {
    store: read.where,
    backend: read.backend,
    prefix: read.prefix,
    reachable: true,
    healthy: health.healthy,
    latencyMs,
    leader: health.leader ?? null,
    lastError: health.lastError ?? null,
    ids: ids.length,
    minId: ids[0]?.[0] ?? null,
    maxId: ids.at(-1)?.[0] ?? null,
    nodes: leases.map((l) => ({
      node: l.node,
      live: l.live,
      expiresAt: l.expiresAt === undefined ? null : new Date(l.expiresAt).toISOString(),
    })),
    references: {
      total: references.length,
      live: references.filter((r) => r.live).length,
    },
    usage: { inUse, unused: ids.length - inUse },
    splitKeys: splitKeys(references).map((s) => ({
      key: s.key,
      ids: s.ids,
      references: s.references,
    })),
    metrics: {
      ...metricsOf(ids, references, range, health.healthy, latencyMs),
      ...(read.drift === undefined ? {} : driftMetrics(read.drift)),
    },
    ...(read.drift === undefined ? {} : { doubleWrite: read.drift }),
  };
}

/** The table `status` prints (without `--json`), at time `now`. */
export function statusRows(
  model: StatusModel,
  range: { readonly min: number; readonly max: number },
  now: number,
): string[][] {
  const { leader, lastError, nodes, references, usage, metrics, splitKeys: splits } = model;
  const rows: string[][] = [
    ["store", model.store],
    ["prefix", model.prefix],
    [
      "reachable",
      `yes, one read took ${model.latencyMs} ms${model.healthy ? "" : " (unhealthy)"}` +
      (lastError ? `; last error: ${lastError}` : ""),
    ],
  ];
  if (leader !== null) rows.push(["leader", leader]);
  if (model.doubleWrite !== undefined) rows.push(...driftRows(model.doubleWrite));
  rows.push([
    "IDs",
    model.ids === 0 ? "none" : `${model.ids} (from ${model.minId} to ${model.maxId})`,
  ]);
  const live = nodes.filter((l) => l.live);
  rows.push(["nodes", `${live.length} with a live lease, ${nodes.length - live.length} lapsed`]);
  for (const l of nodes) rows.push(["", describeLease(l, now)]);
  rows.push(["references", `${references.live} live, ${references.total - references.live} dead`]);
  rows.push([
    "usage",
    `${usage.inUse} in use, ${usage.unused} unused (GC collects them in two passes)`,
  ]);
  const { min, max } = range;
  const held = Object.entries(metrics["idalloc.keys.held"]).sort(([a], [b]) => a < b ? -1 : 1)
    .map(([node, n]) => `${node} ${n}`);
  const free = metrics["idalloc.ids.free"];
  rows.push(["metrics", `idalloc.ids.free ${free} (of ${max - min + 1} in ${min}–${max})`]);
  rows.push(["", `idalloc.keys.held ${held.length === 0 ? "0" : held.join(", ")}`]);
  rows.push(["", `idalloc.healthy ${metrics["idalloc.healthy"]}`]);
  for (const [name, value] of Object.entries(metrics)) {
    if (name.startsWith("idalloc.identity.")) rows.push(["", `${name} ${value}`]);
  }
  if (splits.length > 0) {
    rows.push([
      "split keys",
      `${plural(splits.length, "key")} whose live references name different IDs ` +
      "(written by another writer; stop the nodes whose references are wrong: their " +
      "references go with their leases)",
    ]);
    for (const split of splits) rows.push(["", describeSplit(split)]);
  }
  return rows;
}

/** The double-write rows: identities per side, on one side only, and IDs whose sides differ. */
function driftRows(drift: DriftCount): string[][] {
  return [
    [
      "kvstore side",
      `${drift.kvstore.total} identities, ${drift.kvstore.only} on the kvstore only`,
    ],
    ["CRD side", `${drift.crd.total} identities, ${drift.crd.only} on the CRDs only`],
    [
      "sides differ",
      drift.differing.length === 0 ? "on no ID" : `on ${drift.differing.join(", ")}`,
    ],
  ];
}
