/**
 * GC support on Kubernetes, by Cilium's operator rule with idalloc's references added: mark in the
 * store, then delete with a resource-version precondition.
 *
 * - **List** ({@linkcode gcList}): the identities (one consistent list), **then** the nodes'
 *   reference objects (`refs.ts`), **then** the node Leases, then the `CiliumEndpoint`s of all
 *   namespaces and the `CiliumEndpointSlice`s — from the session's informers
 *   (`endpoint_informer.ts`: the first pass lists them, later passes read what the watch keeps
 *   current and send nothing; a full list when the watch is failing). An identity is in use by `users.ts`'s rule: a live
 *   reference to it (`liveness.ts`; in a reference object, or an annotation of the older layout),
 *   an endpoint or slice naming it, or a creation or mark less than the grace ago (the allocator's
 *   `gcGraceMs`, by default Cilium's heartbeat timeout on this store:
 *   `K8sBackend.defaultGcGraceMs`). The order matters: references listed after the identities
 *   catch every join that the identity's version does not show (`refs.ts` has the argument), and
 *   listed before the Leases, every reference predates the Lease it is judged by, and epochs are
 *   never revived.
 * - **Version** = the identity's resource version. A join writes the joiner's reference object,
 *   not the identity, unless the identity is marked: then the joiner removes the mark, which
 *   changes the version; mark and unmark change it too, so the delete's precondition refuses a
 *   delete of an identity a joiner saw marked (`refs.ts`: each interleaving).
 * - **Mark** ({@linkcode gcMark}): Cilium's own `io.cilium.heartbeat` annotation (RFC 3339 time),
 *   written under the listed version; Cilium's agents and idalloc's nodes remove it when they use
 *   the identity. The candidate's `markedAt` is the mark's time, whoever wrote it (a previous
 *   process, Cilium's operator), so the grace counts from it (and the listing reports the
 *   identity in use until then).
 * - **Delete** ({@linkcode gcDelete}): `DELETE` with `preconditions.resourceVersion`; then the
 *   key's claim, if it still names the ID and is quiet (guarded by its own version; a claim a
 *   node wrote recently may be that node re-creating the identity, see `claim.ts`: a later
 *   pass's sweep removes it once quiet).
 * - **Sweep** (a writable session's listing, `sweep.ts`, `lease_gc.ts`): dead references (of the
 *   older layout) on identities in use, quiet stale claims, lapsed node Leases and the reference
 *   objects of nodes that are not live.
 *
 * @module
 */
import type { GcCandidate, GcListOptions } from "../../allocator/backend.ts";
import type { GcSkip } from "../../allocator/damage.ts";
import { idallocLogger } from "../../log.ts";
import { claimNames, claimQuiet } from "./claim.ts";
import type { K8sContext } from "./context.ts";
import { checkCoordination } from "./coordination.ts";
import { countedClient, isStatus, type KubeObject, type Tally, unlessRefused } from "./kube.ts";
import {
  claimName,
  type IdentityRecord,
  type NodeLeaseRecord,
  type NodeRefsRecord,
  parseTime,
  readClaim,
  readIdentity,
  rfc3339Nano,
} from "./layout.ts";
import { readNodeLeases, refLive } from "./liveness.ts";
import { LEASES, storeGraceMs } from "./options.ts";
import { sweepLeases } from "./lease_gc.ts";
import { listAll } from "./paging.ts";
import { markPatch } from "./patch.ts";
import { readReferenceObjects, referencesById } from "./refs.ts";
import {
  deadReferences,
  listClaims,
  removableClaims,
  sweepClaims,
  sweepReferences,
} from "./sweep.ts";
import type { EndpointUsers } from "./endpoint_informer.ts";
import { inUse, readEndpointUsers, type UserIndex } from "./users.ts";

const log = idallocLogger("k8s");

/** The GC candidate of `record` (see the module doc). */
export function candidateOf(record: IdentityRecord, used: boolean): GcCandidate {
  const markedAt = record.mark === undefined ? undefined : parseTime(record.mark);
  return {
    id: record.id,
    key: record.key,
    version: record.rv,
    inUse: used,
    ...(markedAt === undefined ? {} : { markedAt }),
  };
}

/** What one GC listing read, in this order (module doc). */
interface GcSnapshot {
  /** The time (own clock) before the identities were listed. */
  readonly listedAt: number;
  readonly items: readonly KubeObject[];
  /** The nodes' reference objects, by node. */
  readonly refObjects: ReadonlyMap<string, NodeRefsRecord>;
  /** Their references by identity: ID → node → epoch. */
  readonly refs: ReadonlyMap<number, ReadonlyMap<string, string>>;
  readonly leases: ReadonlyMap<string, NodeLeaseRecord>;
  /** ID → the Cilium objects naming it (`users.ts`). */
  readonly users: UserIndex;
}

async function readGcSnapshot(
  ctx: K8sContext,
  signal: AbortSignal,
  endpoints: EndpointUsers | undefined,
  tally?: Tally,
): Promise<GcSnapshot> {
  const listedAt = ctx.settings.now();
  const { items } = await listAll(countedClient(ctx.client, tally), ctx.identities, { signal });
  const refObjects = await readReferenceObjects(ctx, signal, tally);
  const leases = await readNodeLeases(ctx, signal, tally);
  const users = endpoints === undefined
    ? await readEndpointUsers(ctx, signal, tally)
    : await endpoints.read(signal, tally);
  const refs = referencesById(refObjects.values());
  return { listedAt, items, refObjects, refs, leases, users };
}

/**
 * Every identity with `min <= id <= max`, with its version, liveness and mark (module doc). With
 * `sweep` (a writable session), once the listing is complete, also removes the dead references
 * of identities in use and quiet stale claims (`sweep.ts`). With `endpoints` (a session's
 * informers), endpoints and slices are read from them; without, listed in full.
 */
export async function* gcList(
  ctx: K8sContext,
  range: { min: number; max: number },
  signal: AbortSignal,
  options: GcListOptions & {
    readonly sweep?: boolean;
    readonly graceMs?: number;
    readonly endpoints?: EndpointUsers;
  } = {},
  tally?: Tally,
): AsyncGenerator<GcCandidate> {
  const snap = await readGcSnapshot(ctx, signal, options.endpoints, tally);
  checkCoordination(snap.items, ctx.namespace);
  const { now, maxClockSkewMs } = ctx.settings;
  // The grace keeps what was created or marked within it (`users.ts`): the session's, else the
  // store's default (Cilium's heartbeat timeout).
  const use = { maxClockSkewMs, graceMs: options.graceMs ?? storeGraceMs(ctx.settings) };
  const holders = new Map<number, string | null>();
  const dead = new Map<number, Map<string, string>>();
  for (const obj of snap.items) {
    const read = readIdentity(obj);
    if (!read.ok) {
      if (read.damage.id !== undefined) holders.set(read.damage.id, null);
      if (!inRange(read.damage.id, range)) continue;
      const { kind, name, reason } = read.damage;
      skip(options, { kind, entry: identityEntry(ctx, name), reason });
      continue;
    }
    const { record, badRefs } = read;
    holders.set(record.id, record.key);
    if (!inRange(record.id, range)) continue;
    for (const bad of badRefs) {
      // Not a reference: it neither keeps the identity nor frees it.
      skip(options, {
        kind: "reference-bad-key",
        entry: `${identityEntry(ctx, String(record.id))} annotation ${bad.annotation}`,
        reason: bad.reason,
      });
    }
    const at = now();
    const { leases, users, refs } = snap;
    const used = inUse(record, { refs, leases, users, now: at, settings: use });
    const gone = deadReferences(record, snap.leases, at, maxClockSkewMs);
    if (used && gone.size > 0) dead.set(record.id, gone);
    yield candidateOf(record, used);
  }
  // Only after a complete listing (a consumer that stops early ends the generator before).
  if (options.sweep) await sweep(ctx, { snap, holders, dead, range }, signal, tally);
}

/** An ID within `range`; an identity not named by an ID is reported whatever the range. */
function inRange(id: number | undefined, range: { min: number; max: number }): boolean {
  return id === undefined || (id >= range.min && id <= range.max);
}

/** The sweep after a listing (`sweep.ts`); failures are logged, the next pass tries again. */
async function sweep(
  ctx: K8sContext,
  pass: {
    readonly snap: GcSnapshot;
    readonly holders: ReadonlyMap<number, string | null>;
    readonly dead: ReadonlyMap<number, ReadonlyMap<string, string>>;
    readonly range: { min: number; max: number };
  },
  signal: AbortSignal,
  tally?: Tally,
): Promise<void> {
  const client = countedClient(ctx.client, tally);
  try {
    await sweepReferences(client, ctx, pass.dead, signal);
    const claims = await listClaims(client, ctx, signal);
    const stale = removableClaims(claims, pass.holders, pass.range, pass.snap.listedAt, ctx);
    await sweepClaims(client, ctx, stale, signal);
    await sweepLeases(client, ctx, pass.snap.leases, pass.snap.refObjects, signal);
  } catch (err) {
    if (signal.aborted) throw err;
    log.warning("GC's sweep of dead references and stale claims failed: {err}", { err });
  }
}

function skip(options: GcListOptions, s: GcSkip): void {
  log.warning("GC skips {entry}: {reason}", { entry: s.entry, reason: s.reason });
  options.onSkip?.(s);
}

/** How an identity object is named in messages: `ciliumidentities.cilium.io/7`. */
export function identityEntry(ctx: K8sContext, name: string): string {
  return `${ctx.resourceName}/${name}`;
}

/**
 * Marks `candidate` unused with Cilium's annotation, only if it is still at its listed version.
 * Returns the new version, or `undefined` when the identity changed or vanished meanwhile.
 */
export async function gcMark(
  ctx: K8sContext,
  candidate: GcCandidate,
  signal: AbortSignal,
): Promise<string | undefined> {
  const body = markPatch(candidate.version, rfc3339Nano(ctx.settings.now()));
  const marked = await unlessRefused(
    ctx.client.patch(ctx.identities, String(candidate.id), body, { type: "merge", signal }),
    409,
    404,
  );
  return marked === undefined ? undefined : String(marked.metadata.resourceVersion ?? "");
}

/**
 * Deletes `candidate`'s identity only if it was listed unused and is still at `candidate.version`,
 * marked (a joiner's removal of the mark since refuses it), then its key's claim if that still
 * names the ID. A candidate listed in use is never deleted: the version precondition only proves
 * nothing changed since the listing, and what the listing saw was a live reference (an epoch never
 * comes back to life, so a reference listed dead stays dead at the same version).
 *
 * A join writes the joiner's reference object, not the identity, so only the mark, which joiners
 * remove, lets the version show a join (`refs.ts`). A candidate listed unmarked (a direct call,
 * not GC's passes, which mark first and delete a grace later) is marked now under its listed
 * version, its references are read again, and it is deleted under the marked version only if none
 * is live: a join before that read is seen; one after it meets the mark, or, if its informer has
 * not shown the mark yet, loses the identity and re-creates it from the claim (`refs.ts`, case 3;
 * GC's grace is what makes that case need a watch trailing by the whole grace).
 */
export async function gcDelete(
  ctx: K8sContext,
  candidate: GcCandidate,
  signal: AbortSignal,
): Promise<boolean> {
  if (candidate.inUse) return false;
  // Claims are judged quiet at a time before the delete: a re-creation of the identity comes after.
  const judgedAt = ctx.settings.now();
  let version = candidate.version;
  if (candidate.markedAt === undefined) {
    const marked = await gcMark(ctx, candidate, signal);
    if (marked === undefined || await referencedNow(ctx, candidate.id, signal)) return false;
    version = marked;
  }
  let deleted: boolean;
  try {
    deleted = await ctx.client.delete(ctx.identities, String(candidate.id), {
      resourceVersion: version,
      signal,
    });
  } catch (err) {
    if (isStatus(err, 409)) return false;
    throw err;
  }
  if (!deleted) return false;
  try {
    await dropClaim(ctx, candidate.key, candidate.id, judgedAt, signal);
  } catch (err) {
    // A claim left behind is stale and handled as such by the next acquire of the key.
    log.warning("could not remove the claim of {key} after collecting {id}: {err}", {
      key: candidate.key,
      id: candidate.id,
      err,
    });
  }
  return true;
}

/**
 * Whether a live node's reference object names identity `id` now (the objects read, then the
 * Leases that judge them, as a listing reads them).
 */
async function referencedNow(ctx: K8sContext, id: number, signal: AbortSignal): Promise<boolean> {
  const byId = referencesById((await readReferenceObjects(ctx, signal)).values());
  const leases = await readNodeLeases(ctx, signal);
  const { now, maxClockSkewMs } = ctx.settings;
  const at = now();
  return [...byId.get(id) ?? []].some(([node, epoch]) =>
    refLive(epoch, leases.get(node), at, maxClockSkewMs)
  );
}

/**
 * Deletes `key`'s claim if it names `id` and was quiet at `judgedAt` (`claim.ts`), guarded by its
 * version. Returns whether it deleted.
 */
export async function dropClaim(
  ctx: K8sContext,
  key: string,
  id: number,
  judgedAt: number,
  signal: AbortSignal,
): Promise<boolean> {
  const name = claimName(ctx.resourceName, key);
  const obj = await ctx.client.get(LEASES, name, { namespace: ctx.namespace, signal });
  const claim = obj === undefined ? undefined : readClaim(obj);
  if (!claimNames(claim, key, id) || !claimQuiet(claim!, judgedAt, ctx.settings)) return false;
  try {
    return await ctx.client.delete(LEASES, name, {
      namespace: ctx.namespace,
      resourceVersion: claim!.rv,
      signal,
    });
  } catch (err) {
    if (isStatus(err, 409)) return false;
    throw err;
  }
}
