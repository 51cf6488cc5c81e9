/**
 * What keeps an identity in use on Kubernetes, the one rule GC and the doctor judge by: Cilium
 * operator's (v1.16, CRD mode) with idalloc's references added. An identity is in use while
 *
 * - a **live idalloc node** references it (`liveness.ts`): in its reference object (`refs.ts`),
 *   or by an annotation of the older layout on the identity (counted during the migration);
 * - a **`CiliumEndpoint`** names it (`status.identity.id`), or an entry of a
 *   **`CiliumEndpointSlice`** does (`endpoints[].id`; clusters with CES enabled, where Cilium's
 *   operator counts the slices too);
 * - it was **created or marked unused** (`io.cilium.heartbeat`) **less than the grace ago**. The
 *   grace is Cilium's heartbeat timeout by default (`heartbeatTimeoutMs`, Cilium operator's
 *   `--identity-heartbeat-timeout`, 30 min): Cilium's operator counts a new identity alive for
 *   that long, so that the agent that allocated it has time to write the endpoint naming it, and
 *   deletes a marked one no sooner than that after the mark. The creation time (the API server's
 *   clock, one-second resolution) is judged with a second and the clock-skew margin more; the
 *   mark, like GC's own marks in the allocator, by its time. A grace of 0 (an allocator's explicit
 *   `gcGraceMs: 0`: tests, a drain) turns this part off.
 *
 * The doctor reads endpoints and slices with full paged lists (`paging.ts`), all namespaces for
 * the endpoints; GC's passes read them from informers that list once and then watch
 * (`endpoint_informer.ts`). A resource that is not installed counts as none (warned once).
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
 * const settings = { maxClockSkewMs: 0, graceMs: 60_000 };
 * const use = { leases: new Map(), users, now: 1_000_000, settings };
 * const old = { id: 302, refs: new Map(), created: 0 };
 * assert.deepEqual(usedBy({ ...old, id: 300 }, use), ["CiliumEndpoint prod/web-1"]);
 * assert.deepEqual(usedBy({ ...old, id: 301 }, use), ["CiliumEndpointSlice ces-1"]);
 * assert.deepEqual(usedBy(old, use), []);
 * assert.equal(usedBy({ ...old, created: 950_000 }, use).length, 1, "created 50 s ago");
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
import { type FullList, listAll } from "./paging.ts";
import { referencesOf } from "./refs.ts";

const log = idallocLogger("k8s");

/** The settings the rule needs. */
export interface UseSettings {
  /** The clock-skew margin, in ms. */
  readonly maxClockSkewMs: number;
  /** How long a creation or a mark keeps an identity in use, in ms; 0: not at all. */
  readonly graceMs: number;
}

/**
 * ID → the Cilium objects naming it: a `Map` from a listing ({@linkcode endpointUsers}), or GC's
 * informers' view (`endpoint_informer.ts`), which names them by kind and count.
 */
export interface UserIndex {
  /** The Cilium objects naming `id`; `undefined` or empty: none. */
  get(id: number): readonly string[] | undefined;
}

/**
 * What one judgement reads: the nodes' references, their Leases, the Cilium users by ID, the time.
 */
export interface IdentityUse {
  /**
   * The references in the nodes' reference objects: ID → node → epoch (`refs.ts`), read after the
   * identities and before the Leases. Absent: none.
   */
  readonly refs?: ReadonlyMap<number, ReadonlyMap<string, string>>;
  /** Node Leases by node. */
  readonly leases: ReadonlyMap<string, NodeLeaseRecord>;
  /** ID → the Cilium objects naming it (`CiliumEndpoint ns/name`, `CiliumEndpointSlice name`). */
  readonly users: UserIndex;
  /** The observer's time, in ms. */
  readonly now: number;
  /** Skew margin and grace. */
  readonly settings: UseSettings;
}

/** The identity ID an endpoint or slice entry names, if it is one. */
function idOf(value: unknown): number | undefined {
  return typeof value === "number" && Number.isSafeInteger(value) && value > 0 ? value : undefined;
}

/** The ID a `CiliumEndpoint` names (`status.identity.id`), if any. */
export function endpointIdOf(cep: KubeObject): number | undefined {
  return idOf((cep.status as { identity?: { id?: unknown } } | undefined)?.identity?.id);
}

/** The IDs the entries of a `CiliumEndpointSlice` name (`endpoints[].id`), each once. */
export function sliceIdsOf(ces: KubeObject): number[] {
  const entries = (ces as { endpoints?: unknown }).endpoints;
  if (!Array.isArray(entries)) return [];
  const ids = new Set<number>();
  for (const entry of entries) {
    const id = idOf((entry as { id?: unknown } | null)?.id);
    if (id !== undefined) ids.add(id);
  }
  return [...ids];
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
    const { namespace, name } = cep.metadata;
    add(endpointIdOf(cep), `CiliumEndpoint ${namespace ?? ""}/${name ?? ""}`);
  }
  for (const ces of slices) {
    for (const id of sliceIdsOf(ces)) add(id, `CiliumEndpointSlice ${ces.metadata.name}`);
  }
  return users;
}

const missingWarned = new Set<string>();

/**
 * Every object of the optional `res` in one snapshot (paged; all namespaces for a namespaced
 * one), or `undefined` when it is not installed (warned once per resource and process).
 */
export async function listEndpointObjects(
  ctx: K8sContext,
  res: KubeResource,
  signal: AbortSignal,
  tally?: Tally,
): Promise<FullList | undefined> {
  try {
    const client = countedClient(ctx.client, tally);
    return await listAll(client, res, { allNamespaces: res.namespaced, signal });
  } catch (err) {
    if (!(err instanceof ResourceNotInstalledError)) throw err;
    const name = `${res.plural}.${res.group}/${res.version}`;
    if (!missingWarned.has(name)) {
      missingWarned.add(name);
      log.warning("no {name} resource: GC and doctor count none of its objects as users", {
        name,
      });
    }
    return undefined;
  }
}

/** Every object of the optional `res` (paged); none when it is not installed (warned once). */
async function listOptional(
  ctx: K8sContext,
  res: KubeResource | undefined,
  signal: AbortSignal,
  tally?: Tally,
): Promise<KubeObject[]> {
  if (res === undefined) return [];
  return (await listEndpointObjects(ctx, res, signal, tally))?.items ?? [];
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
 * Until when `record` counts as new or freshly marked (ms, observer's clock; see the module doc),
 * or `-Infinity` with no grace.
 */
export function recentUntil(
  record: Pick<IdentityRecord, "created" | "mark">,
  settings: UseSettings,
): number {
  if (settings.graceMs <= 0) return -Infinity;
  const marked = record.mark === undefined ? undefined : parseTime(record.mark);
  const created = record.created + 1_000 + settings.maxClockSkewMs;
  return Math.max(created, marked ?? -Infinity) + settings.graceMs;
}

/**
 * Who keeps `record` in use (see the module doc): its live nodes, the Cilium objects naming it,
 * and `new or marked recently (in use until <time>)` within the grace. Empty: unused.
 */
export function usedBy(
  record: Pick<IdentityRecord, "id" | "refs" | "created" | "mark">,
  use: IdentityUse,
): string[] {
  const { leases, users, now, settings } = use;
  const out: string[] = [];
  for (const [node, epoch] of referencesOf(record, use.refs ?? new Map())) {
    const live = refLive(epoch, leases.get(node), now, settings.maxClockSkewMs);
    if (live && !out.includes(node)) out.push(node);
  }
  out.push(...users.get(record.id) ?? []);
  const until = recentUntil(record, settings);
  if (now < until) out.push(`new or marked recently (in use until ${isoSeconds(until)})`);
  return out;
}

/** Whether `record` is in use (see the module doc). */
export function inUse(
  record: Pick<IdentityRecord, "id" | "refs" | "created" | "mark">,
  use: IdentityUse,
): boolean {
  return usedBy(record, use).length > 0;
}

function isoSeconds(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d+Z$/, "Z");
}
