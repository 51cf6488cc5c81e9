/**
 * What keeps an identity in use on Kubernetes, the one rule GC and the doctor judge by: Cilium
 * operator's (v1.16, CRD mode) with idalloc's references added. An identity is in use while
 *
 * - a **live idalloc node** references it (`liveness.ts`);
 * - a **`CiliumEndpoint`** names it (`status.identity.id`), or an entry of a
 *   **`CiliumEndpointSlice`** does (`endpoints[].id`; clusters with CES enabled, where Cilium's
 *   operator counts the slices too);
 * - it was **written less than Cilium's heartbeat timeout ago** (`heartbeatTimeoutMs`, Cilium's
 *   `--identity-heartbeat-timeout`, 30 min by default): created, changed by any writer, or marked
 *   unused (`io.cilium.heartbeat`). Cilium's operator counts an identity alive for that long after
 *   each change it sees, so that an agent that allocated one has time to write the endpoint that
 *   names it; a mark is such a change, so an identity is deleted no sooner than a heartbeat
 *   timeout after it was marked. The newest write is the newest of `creationTimestamp`, the
 *   `managedFields` times and the mark's own time, each judged with the clock-skew margin (and a
 *   second more for the API server's one-second timestamps), so idalloc is never quicker than the
 *   operator.
 *
 * Endpoints and slices are read with full paged lists (`paging.ts`), all namespaces for the
 * endpoints; a resource that is not installed counts as none (warned once).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { endpointUsers, usedBy } from "./users.ts";
 *
 * const users = endpointUsers(
 *   [{ metadata: { name: "web-1", namespace: "prod" }, status: { identity: { id: 300 } } }],
 *   [{ metadata: { name: "ces-1" }, endpoints: [{ name: "db-1", id: 301 }] }],
 * );
 * const settings = { maxClockSkewMs: 0, heartbeatTimeoutMs: 60_000 };
 * const use = { leases: new Map(), users, now: 1_000_000, settings };
 * const old = { id: 302, refs: new Map(), written: 0 };
 * assert.deepEqual(usedBy({ ...old, id: 300 }, use), ["CiliumEndpoint prod/web-1"]);
 * assert.deepEqual(usedBy({ ...old, id: 301 }, use), ["CiliumEndpointSlice ces-1"]);
 * assert.deepEqual(usedBy(old, use), []);
 * assert.equal(usedBy({ ...old, written: 950_000 }, use).length, 1, "written 50 s ago");
 * ```
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { ResourceNotInstalledError } from "./errors.ts";
import { countedClient, type KubeObject, type KubeResource, type Tally } from "./kube.ts";
import { type IdentityRecord, type NodeLeaseRecord, parseTime } from "./layout.ts";
import { refLive } from "./liveness.ts";
import { listAll } from "./paging.ts";

const log = idallocLogger("k8s");

/** The settings the rule needs. */
export interface UseSettings {
  /** The clock-skew margin, in ms. */
  readonly maxClockSkewMs: number;
  /** Cilium operator's heartbeat timeout, in ms. */
  readonly heartbeatTimeoutMs: number;
}

/** What one judgement reads: the node Leases, the Cilium users by ID, the time. */
export interface IdentityUse {
  /** Node Leases by node. */
  readonly leases: ReadonlyMap<string, NodeLeaseRecord>;
  /** ID → the Cilium objects naming it (`CiliumEndpoint ns/name`, `CiliumEndpointSlice name`). */
  readonly users: ReadonlyMap<number, readonly string[]>;
  /** The observer's time, in ms. */
  readonly now: number;
  /** Skew margin and heartbeat timeout. */
  readonly settings: UseSettings;
}

/** The identity ID an endpoint or slice entry names, if it is one. */
function idOf(value: unknown): number | undefined {
  return typeof value === "number" && Number.isSafeInteger(value) && value > 0 ? value : undefined;
}

/**
 * ID → the Cilium objects naming it: each endpoint by `status.identity.id`, each slice by its
 * entries' `id`.
 */
export function endpointUsers(
  endpoints: readonly KubeObject[],
  slices: readonly KubeObject[] = [],
): Map<number, string[]> {
  const users = new Map<number, string[]>();
  const add = (id: number | undefined, user: string) => {
    if (id === undefined) return;
    const list = users.get(id) ?? [];
    if (!list.includes(user)) list.push(user);
    users.set(id, list);
  };
  for (const cep of endpoints) {
    const id = (cep.status as { identity?: { id?: unknown } } | undefined)?.identity?.id;
    const { namespace, name } = cep.metadata;
    add(idOf(id), `CiliumEndpoint ${namespace ?? ""}/${name ?? ""}`);
  }
  for (const ces of slices) {
    const entries = (ces as { endpoints?: unknown }).endpoints;
    if (!Array.isArray(entries)) continue;
    for (const entry of entries) {
      add(idOf((entry as { id?: unknown } | null)?.id), `CiliumEndpointSlice ${ces.metadata.name}`);
    }
  }
  return users;
}

const missingWarned = new Set<string>();

/** Every object of the optional `res` (paged); none when it is not installed (warned once). */
async function listOptional(
  ctx: K8sContext,
  res: KubeResource | undefined,
  signal: AbortSignal,
  tally?: Tally,
): Promise<KubeObject[]> {
  if (res === undefined) return [];
  try {
    const client = countedClient(ctx.client, tally);
    return (await listAll(client, res, { allNamespaces: res.namespaced, signal })).items;
  } catch (err) {
    if (!(err instanceof ResourceNotInstalledError)) throw err;
    const name = `${res.plural}.${res.group}/${res.version}`;
    if (!missingWarned.has(name)) {
      missingWarned.add(name);
      log.warning("no {name} resource: GC and doctor count none of its objects as users", {
        name,
      });
    }
    return [];
  }
}

/** Every `CiliumEndpoint` (all namespaces), then every `CiliumEndpointSlice`; paged lists. */
export async function readEndpoints(
  ctx: K8sContext,
  signal: AbortSignal,
  tally?: Tally,
): Promise<{ endpoints: KubeObject[]; endpointSlices: KubeObject[] }> {
  const endpoints = await listOptional(ctx, ctx.endpoints, signal, tally);
  const endpointSlices = await listOptional(ctx, ctx.endpointSlices, signal, tally);
  return { endpoints, endpointSlices };
}

/** The Cilium objects naming each ID (see {@linkcode readEndpoints}). */
export async function readEndpointUsers(
  ctx: K8sContext,
  signal: AbortSignal,
  tally?: Tally,
): Promise<Map<number, string[]>> {
  const { endpoints, endpointSlices } = await readEndpoints(ctx, signal, tally);
  return endpointUsers(endpoints, endpointSlices);
}

/**
 * Until when `record` counts as recently written (ms, observer's clock): its newest write (one
 * second more for the server's one-second timestamps) or its mark, whichever is newer, plus the
 * heartbeat timeout and the skew margin.
 */
export function recentUntil(
  record: Pick<IdentityRecord, "written" | "mark">,
  settings: UseSettings,
): number {
  const marked = record.mark === undefined ? undefined : parseTime(record.mark);
  const newest = Math.max(record.written + 1_000, marked ?? 0);
  return newest + settings.heartbeatTimeoutMs + settings.maxClockSkewMs;
}

/**
 * Who keeps `record` in use (see the module doc): its live nodes, the Cilium objects naming it,
 * and `written … (heartbeat timeout)` while it counts as recently written. Empty: unused.
 */
export function usedBy(
  record: Pick<IdentityRecord, "id" | "refs" | "written" | "mark">,
  use: IdentityUse,
): string[] {
  const { leases, users, now, settings } = use;
  const out: string[] = [];
  for (const [node, epoch] of record.refs) {
    if (refLive(epoch, leases.get(node), now, settings.maxClockSkewMs)) out.push(node);
  }
  out.push(...users.get(record.id) ?? []);
  const until = recentUntil(record, settings);
  if (now < until) out.push(`written recently (in use until ${isoSeconds(until)})`);
  return out;
}

/** Whether `record` is in use (see the module doc). */
export function inUse(
  record: Pick<IdentityRecord, "id" | "refs" | "written" | "mark">,
  use: IdentityUse,
): boolean {
  return usedBy(record, use).length > 0;
}

function isoSeconds(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");
}
