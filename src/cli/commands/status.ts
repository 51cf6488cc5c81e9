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

interface Usage {
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

function describeLease(lease: NodeLease, now: number): string {
  const state = lease.live ? "live" : "lapsed";
  if (lease.expiresAt === undefined) return `${lease.node}: ${state}`;
  return `${lease.node}: ${state}, lease ends ${inSeconds(lease.expiresAt - now)}`;
}

/** The counters `status` shares with an allocator's metrics, under the metrics' names. */
interface StatusMetrics {
  /** Free IDs in `--min`…`--max`. */
  readonly "idalloc.ids.free": number;
  /** Keys each node holds (its live references). */
  readonly "idalloc.keys.held": Record<string, number>;
  /** Whether the store answered healthily. */
  readonly "idalloc.healthy": 0 | 1;
  /** The first read's latency, in seconds. */
  readonly "idalloc.store.operation.duration": number;
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

/** `status`. */
export async function statusCommand(
  ctx: RunContext,
  _options: StatusCommandOptions,
): Promise<number> {
  const { output } = ctx;
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
  const liveKeys = new Set(references.filter((r) => r.live).map((r) => r.key));
  const inUse = ids.filter(([, key]) => liveKeys.has(key)).length;
  const usage: Usage = { inUse, unused: ids.length - inUse };
  const splits = splitKeys(references);
  const now = Date.now();
  const summary = {
    store: store.where,
    backend: store.kind,
    prefix: store.prefix,
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
    usage,
    splitKeys: splits.map((s) => ({ key: s.key, ids: s.ids, references: s.references })),
    metrics: metricsOf(ids, references, ctx.options, health.healthy, latencyMs),
  };
  if (ctx.options.json) {
    output.out.line(JSON.stringify(summary));
    return ExitCode.Ok;
  }
  const rows: string[][] = [
    ["store", store.where],
    ["prefix", store.prefix],
    [
      "reachable",
      `yes, one read took ${latencyMs} ms${health.healthy ? "" : " (unhealthy)"}` +
      (health.lastError ? `; last error: ${health.lastError}` : ""),
    ],
  ];
  if (health.leader !== undefined) rows.push(["leader", health.leader]);
  rows.push([
    "IDs",
    ids.length === 0 ? "none" : `${ids.length} (from ${summary.minId} to ${summary.maxId})`,
  ]);
  const live = leases.filter((l) => l.live);
  rows.push(["nodes", `${live.length} with a live lease, ${leases.length - live.length} lapsed`]);
  for (const l of leases) rows.push(["", describeLease(l, now)]);
  rows.push([
    "references",
    `${summary.references.live} live, ${summary.references.total - summary.references.live} dead`,
  ]);
  rows.push([
    "usage",
    `${usage.inUse} in use, ${usage.unused} unused (GC collects them in two passes)`,
  ]);
  const { min, max } = ctx.options;
  const held = Object.entries(summary.metrics["idalloc.keys.held"]).sort(([a], [b]) =>
    a < b ? -1 : 1
  )
    .map(([node, n]) => `${node} ${n}`);
  rows.push([
    "metrics",
    `idalloc.ids.free ${summary.metrics["idalloc.ids.free"]} (of ${
      max - min + 1
    } in ${min}–${max})`,
  ]);
  rows.push(["", `idalloc.keys.held ${held.length === 0 ? "0" : held.join(", ")}`]);
  rows.push(["", `idalloc.healthy ${summary.metrics["idalloc.healthy"]}`]);
  if (splits.length > 0) {
    rows.push([
      "split keys",
      `${plural(splits.length, "key")} whose live references name different IDs ` +
      "(written by another writer; stop the nodes whose references are wrong: their " +
      "references go with their leases)",
    ]);
    for (const split of splits) rows.push(["", describeSplit(split)]);
  }
  writeTable(output.out, null, rows);
  return ExitCode.Ok;
}
