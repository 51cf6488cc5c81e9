/**
 * `status`: is the store reachable and how fast does it answer, how many IDs are stored, which
 * nodes hold a lease, and (`--usage`, one more pass over every reference) how many IDs are in use
 * and how many GC would collect.
 *
 * @module
 */
import type { BackendSession, SessionStatus } from "../../allocator/backend.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import type { NodeLease } from "../store.ts";
import { writeTable } from "../table.ts";
import { listMasters, pause } from "./common.ts";

/** Options of `status`. */
export interface StatusCommandOptions {
  /** Also count IDs in use and unused (reads every reference). */
  readonly usage: boolean;
}

/** How long `status` waits for the etcd leader to be known. */
const LEADER_WAIT_MS = 1_000;

interface Usage {
  readonly inUse: number;
  readonly unused: number;
}

async function usageOf(ctx: RunContext, session: BackendSession): Promise<Usage> {
  const progress = ctx.progress();
  let inUse = 0;
  let unused = 0;
  for await (
    const candidate of session.gcList({ min: 0, max: Number.MAX_SAFE_INTEGER }, ctx.signal)
  ) {
    if (candidate.inUse) inUse++;
    else unused++;
    if (((inUse + unused) & 255) === 0) progress.update(`checking usage… ${inUse + unused} IDs`);
  }
  progress.clear();
  return { inUse, unused };
}

async function sessionStatus(ctx: RunContext, session: BackendSession): Promise<SessionStatus> {
  let status = session.status();
  for (let waited = 0; status.backend === "etcd" && status.leader === undefined; waited += 50) {
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

/** `status [--usage]`. */
export async function statusCommand(
  ctx: RunContext,
  options: StatusCommandOptions,
): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store();
  const session = await store.reader(ctx.signal);
  const started = performance.now();
  await session.getById(1, ctx.signal);
  const latencyMs = Math.round((performance.now() - started) * 10) / 10;
  // The store answered; counting (and --usage) runs as long as it takes.
  ctx.untimed();
  const exists = await store.namespaceExists(ctx.signal);
  const progress = ctx.progress();
  const ids = await listMasters(ctx, session, progress);
  progress.clear();
  const leases: NodeLease[] | undefined = await store.nodeLeases(ctx.signal);
  const usage = options.usage ? await usageOf(ctx, session) : undefined;
  const health = await sessionStatus(ctx, session);
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
    nodes: leases === undefined ? null : leases.map((l) => ({
      node: l.node,
      live: l.live,
      expiresAt: new Date(l.expiresAt).toISOString(),
    })),
    usage: usage ?? null,
  };
  if (ctx.options.json) {
    output.out.line(JSON.stringify(summary));
  } else {
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
    if (leases === undefined) {
      rows.push(["nodes", "not listed on etcd (references expire with their etcd leases)"]);
    } else {
      const live = leases.filter((l) => l.live);
      rows.push([
        "nodes",
        `${live.length} with a live lease, ${leases.length - live.length} lapsed`,
      ]);
      for (const l of leases.sort((a, b) => a.node < b.node ? -1 : 1)) {
        rows.push([
          "",
          `${l.node}: ${l.live ? "live" : "lapsed"}, lease ends ${inSeconds(l.expiresAt - now)}`,
        ]);
      }
    }
    if (usage !== undefined) {
      rows.push([
        "usage",
        `${usage.inUse} in use, ${usage.unused} unused (GC collects them in two passes)`,
      ]);
    }
    writeTable(output.out, null, rows);
  }
  if (!exists) {
    throw new InvalidOptionsError(
      `nothing is stored under prefix ${store.prefix} in ${store.where} (wrong --prefix?)`,
    );
  }
  return ExitCode.Ok;
}
