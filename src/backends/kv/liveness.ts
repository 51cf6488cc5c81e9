/**
 * Whether a reference is live. `expireIn` on a lease record is only a lower bound on its deletion
 * (locally an expired record stays readable for about a minute), so liveness is judged from the
 * `expiresAt` inside the value, with the clock-skew margin, never from the record's presence.
 *
 * @module
 */
import type { GcSkip } from "../../allocator/damage.ts";
import { getMany, type KvStats, list } from "./client.ts";
import type { KvContext } from "./context.ts";
import { corrupt, decode, formatKey, type LeaseValue, type RefValue } from "./schema.ts";

/** One reference `[...P, "ref", key, node]` as read. */
export interface Reference {
  readonly key: string;
  readonly node: string;
  readonly value: RefValue;
  readonly versionstamp: string;
}

/** A node's lease record as read: its decoded value (if valid) and its versionstamp. */
export interface LeaseRecord {
  readonly value: LeaseValue | undefined;
  /** `null` when the record is absent. */
  readonly versionstamp: string | null;
}

/**
 * A reference is live iff its node's lease record exists, has the reference's lease id, and
 * `expiresAt + maxClockSkewMs > now`.
 */
export function isLive(
  ref: RefValue,
  lease: LeaseRecord | undefined,
  now: number,
  maxClockSkewMs: number,
): boolean {
  const v = lease?.value;
  return v !== undefined && v.lease === ref.lease && !isExpired(v, now, maxClockSkewMs);
}

/**
 * Whether a node is live: its lease record can be read and has not expired (beyond the skew
 * margin). Operator tools never delete what such a node holds, whichever lease id its entries
 * name: a reference of its older lease is dead for the allocator, but the node is still there.
 */
export function nodeIsLive(
  lease: LeaseRecord | undefined,
  now: number,
  maxClockSkewMs: number,
): boolean {
  return lease?.value !== undefined && !isExpired(lease.value, now, maxClockSkewMs);
}

/**
 * Whether a lease is past `expiresAt` by more than the skew margin: then no reference of it is
 * live for any observer, and its node never renews it (it takes a new lease id instead).
 */
export function isExpired(lease: LeaseValue, now: number, maxClockSkewMs: number): boolean {
  return lease.expiresAt + maxClockSkewMs <= now;
}

/** Reads the lease records of `nodes` (batched), reusing and filling `cache` when given. */
export async function readLeases(
  ctx: KvContext,
  stats: KvStats,
  nodes: Iterable<string>,
  signal: AbortSignal,
  cache: Map<string, LeaseRecord> = new Map(),
): Promise<Map<string, LeaseRecord>> {
  const missing = [...new Set(nodes)].filter((n) => !cache.has(n));
  const entries = await getMany(ctx, stats, missing.map((n) => ctx.layout.lease(n)), signal);
  entries.forEach((entry, i) => {
    const value = entry.versionstamp === null
      ? undefined
      : decode.lease(entry as Deno.KvEntry<unknown>);
    cache.set(missing[i], { value, versionstamp: entry.versionstamp });
  });
  return cache;
}

/**
 * The valid references of `key`. Corrupt ones are logged, reported to `onSkip` and left alone: a
 * reference that cannot be read never makes a key look used or unused, nor names its ID.
 */
export async function readRefs(
  ctx: KvContext,
  stats: KvStats,
  key: string,
  signal: AbortSignal,
  onSkip?: (skip: GcSkip) => void,
): Promise<Reference[]> {
  const refs: Reference[] = [];
  for await (const entry of list(ctx, stats, { prefix: ctx.layout.refsOf(key) }, signal)) {
    const parsed = ctx.layout.parseRef(entry.key);
    if (parsed === undefined) {
      corrupt(entry.key, "not a reference key");
      onSkip?.({
        kind: "reference-bad-key",
        entry: formatKey(entry.key),
        reason: "not a reference key",
      });
      continue;
    }
    const value = decode.ref(entry);
    if (value === undefined) {
      onSkip?.({
        kind: "reference-undecodable",
        entry: formatKey(entry.key),
        reason: "not a reference value",
      });
      continue;
    }
    refs.push({ ...parsed, value, versionstamp: entry.versionstamp });
  }
  return refs;
}

/** The references among `refs` that are live now (see {@linkcode isLive}), read from the store. */
export async function liveRefs(
  ctx: KvContext,
  stats: KvStats,
  refs: readonly Reference[],
  signal: AbortSignal,
): Promise<Reference[]> {
  const leases = await readLeases(ctx, stats, refs.map((r) => r.node), signal);
  const now = ctx.settings.now();
  return refs.filter((r) => isLive(r.value, leases.get(r.node), now, ctx.settings.maxClockSkewMs));
}
