/**
 * The damage report on Deno KV ({@linkcode StoreDoctor}): one read-only walk over every family of
 * the layout, reporting entries idalloc cannot use, and a guarded delete of one of them.
 *
 * Reported: masters with a bad ID, an unreadable value or a key too large for the layout; key
 * indexes that cannot be read, that name an ID without a matching master (`index-orphan`), or
 * whose ID (with its master there) lies outside every valid range (`index-out-of-range`);
 * references that cannot be read (or name an ID outside every valid range); counters (`gen`,
 * `touch`) that do not hold a `Deno.KvU64`; lease records and change-feed entries of the wrong
 * shape. Dead references and expired lease records are stale, not damaged: GC sweeps them.
 *
 * Each finding names the live nodes that hold it (a reference: its node while the node's lease is
 * live; a master, key index or touch counter: the nodes whose live references name its ID or
 * key), and a removal refuses such an entry with {@linkcode LiveEntryError}. A removal checks the
 * versionstamp the entry was listed with. Deleting a master also writes its change-feed entry, so
 * watchers drop it from their caches at once.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a session's internal context (tests/backends/kv/garbage.test.ts runs it)
 * for await (const f of findDamage(ctx, stats, { range: { min: 1, max: 1000 } })) {
 *   if (f.kind === "counter-wrong-type") await removeDamage(ctx, stats, f, signal);
 * }
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { z } from "../../deps/zod.ts";
import type { DamageFinding, DamageKind, DamageScanOptions } from "../../allocator/damage.ts";
import {
  decodeToken,
  encodeToken,
  heldBy,
  LiveUse,
  type RangeCheck,
  rangeCheck,
  shorten,
} from "../../allocator/damage.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { commit, commitLogged, get, getMany, type KvStats, list, loggedAtomic } from "./client.ts";
import type { KvContext } from "./context.ts";
import type { KvLayout } from "./layout.ts";
import { KvAdmin } from "./admin.ts";
import { LIST_BATCH, MAX_GET_MANY } from "./limits.ts";
import { liveRefs, nodeIsLive, readLeases, readRefs } from "./liveness.ts";
import { formatKey, isKvU64, peek } from "./schema.ts";

const log = idallocLogger("kv", "doctor");

/** The token's backend tag. */
const TAG = "deno-kv";

/** A key part in a token (JSON has no bigint, bytes or tuple types of its own). */
const partSchema = z.union([
  z.object({ s: z.string() }).strict(),
  z.object({ n: z.number() }).strict(),
  z.object({ i: z.string().regex(/^-?[0-9]+$/) }).strict(),
  z.object({ t: z.boolean() }).strict(),
  z.object({ u: z.string().regex(/^[A-Za-z0-9+/]*={0,2}$/) }).strict(),
]);
const tokenSchema = z.object({
  key: z.array(partSchema).min(1),
  versionstamp: z.string().regex(/^[0-9a-f]{20}$/),
  kind: z.string(),
  /** The holders the listing found (see `heldBy`): such a token is never acted on. */
  held: z.array(z.string()).optional(),
});

/** A finding before its holders are known, with what decides them. */
export interface Pending {
  readonly finding: DamageFinding;
  /** A master's ID: held by the nodes whose live references name it. */
  readonly id?: number;
  /** A key index's or touch counter's key: held by the nodes with live references to it. */
  readonly key?: string;
  /** A reference's node: held by it while its lease is live. */
  readonly node?: string;
}

/** A listed entry. */
type Entry = Deno.KvEntry<unknown>;

/** A key index that names an ID: judged once its master is read (see {@linkcode judgeIndex}). */
export interface IndexEntry {
  readonly entry: Entry;
  readonly key: string;
  readonly id: number;
}

/**
 * Lists every damaged entry under the prefix (see the module doc), each with the live nodes that
 * hold it ({@linkcode DamageFinding.heldBy}): a reference by its node while the node's lease is
 * live, a master by the nodes whose live references name its ID, a key index or touch counter by
 * the nodes with live references to its key. Findings are yielded once the holders are known, after
 * the whole walk.
 */
export async function* findDamage(
  ctx: KvContext,
  stats: KvStats,
  options: DamageScanOptions = {},
): AsyncGenerator<DamageFinding> {
  const signal = options.signal ?? new AbortController().signal;
  const { layout } = ctx;
  const check = rangeCheck(options);
  const pending: Pending[] = [];
  // Key indexes are judged against their masters, read ten at a time.
  const judgeIndexes = async (indexes: IndexEntry[]) => {
    const masters = await getMany(ctx, stats, indexes.map((x) => layout.id(x.id)), signal);
    for (const [i, index] of indexes.entries()) {
      const p = judgeIndex(index, masters[i], check);
      if (p !== undefined) pending.push(p);
    }
  };
  const scan = async (family: string, judge: (e: Entry) => Pending | IndexEntry | undefined) => {
    const indexes: IndexEntry[] = [];
    const prefix = [...layout.prefix, family];
    for await (const e of list(ctx, stats, { prefix }, signal, LIST_BATCH)) {
      const judged = judge(e);
      if (judged === undefined) continue;
      if ("finding" in judged) pending.push(judged);
      else if (indexes.push(judged) >= MAX_GET_MANY) await judgeIndexes(indexes.splice(0));
    }
    if (indexes.length > 0) await judgeIndexes(indexes);
  };

  await scan("id", (e) => judgeMaster(layout, e));
  await scan("key", (e) => readIndex(layout, e));
  await scan("touch", (e) => judgeTouch(layout, e));
  const gen = judgeGen(await get(ctx, stats, layout.gen(), signal));
  if (gen !== undefined) pending.push(gen);
  await scan("ref", (e) => judgeReference(layout, e, check));
  await scan("lease", (e) => judgeLease(layout, e));
  await scan("log", (e) => judgeLog(layout, e));
  yield* withHolders(ctx, stats, pending, signal);
}

/** A master: a bad ID, an unreadable value, a key too large for the layout. */
export function judgeMaster(layout: KvLayout, e: Entry): Pending | undefined {
  const id = layout.parseId(e.key);
  if (id === undefined) {
    return { finding: finding(e, "master-bad-id", "the ID is not a non-negative safe integer") };
  }
  const value = peek.master(e.value);
  if (value === undefined) {
    return {
      finding: finding(e, "master-undecodable", "the value is not { key: string }", { id }),
      id,
    };
  }
  if (layout.fitsKey(value.key)) return undefined;
  const about = { id, key: value.key };
  return {
    finding: finding(e, "master-oversized", "its key is too large for the layout", about),
    id,
  };
}

/** A key index: unreadable (a finding), or the ID it names, to judge against its master. */
export function readIndex(layout: KvLayout, e: Entry): Pending | IndexEntry {
  const key = layout.parseKeyOf(e.key, "key");
  const value = peek.keyIndex(e.value);
  if (key === undefined || value === undefined) {
    return { finding: finding(e, "index-undecodable", "not a key index { id }", { key }), key };
  }
  return { entry: e, key, id: value.id };
}

/**
 * A key index against its master (as read): an orphan when the master is missing or another
 * key's; out of range when the master is the key's (or unreadable, reported as such) but the ID
 * lies outside every valid range.
 */
export function judgeIndex(
  { entry, key, id }: IndexEntry,
  master: Deno.KvEntryMaybe<unknown>,
  check: RangeCheck | undefined,
): Pending | undefined {
  const orphan = (why: string): Pending => ({
    finding: finding(entry, "index-orphan", `it names ID ${id}, ${why}`, { id, key }),
    key,
  });
  if (master.versionstamp === null) return orphan("which has no master");
  const owner = peek.master(master.value);
  if (owner !== undefined && owner.key !== key) return orphan("whose master is another key's");
  if (check === undefined || check.valid(id, key)) return undefined;
  const reason = check.outside(id, key);
  return { finding: finding(entry, "index-out-of-range", reason, { id, key }), key };
}

/** A touch counter that does not hold a `Deno.KvU64`. */
export function judgeTouch(layout: KvLayout, e: Entry): Pending | undefined {
  const key = layout.parseKeyOf(e.key, "touch");
  if (key !== undefined && isKvU64(e.value)) return undefined;
  const reason = "a touch entry must hold a Deno.KvU64";
  return { finding: finding(e, "counter-wrong-type", reason, { key }), key };
}

/** The change counter, when it exists and does not hold a `Deno.KvU64`. */
export function judgeGen(gen: Deno.KvEntryMaybe<unknown>): Pending | undefined {
  if (gen.versionstamp === null || isKvU64(gen.value)) return undefined;
  const entry = gen as Entry;
  return { finding: finding(entry, "counter-wrong-type", "gen must hold a Deno.KvU64") };
}

/** A reference: a bad key, an unreadable value, an ID outside every valid range. */
export function judgeReference(
  layout: KvLayout,
  e: Entry,
  check: RangeCheck | undefined,
): Pending | undefined {
  const parsed = layout.parseRef(e.key);
  if (parsed === undefined) {
    return { finding: finding(e, "reference-bad-key", "not a [ref, key, node] key") };
  }
  const { key, node } = parsed;
  const value = peek.ref(e.value);
  if (value === undefined) {
    const reason = "the value is not { id, lease }";
    return { finding: finding(e, "reference-undecodable", reason, { key, node }), node };
  }
  if (check === undefined || check.valid(value.id, key)) return undefined;
  const reason = check.outside(value.id, key);
  const about = { id: value.id, key, node };
  return { finding: finding(e, "reference-out-of-range", reason, about), node };
}

/** A lease record of the wrong shape. */
export function judgeLease(layout: KvLayout, e: Entry): Pending | undefined {
  if (layout.parseLease(e.key) !== undefined && peek.lease(e.value) !== undefined) {
    return undefined;
  }
  return { finding: finding(e, "lease-undecodable", "not a lease record { lease, expiresAt }") };
}

/** A change-feed entry of the wrong shape. */
export function judgeLog(layout: KvLayout, e: Entry): Pending | undefined {
  if (layout.isLog(e.key) && peek.log(e.value) !== undefined) return undefined;
  return { finding: finding(e, "log-undecodable", "not a change-feed entry { id, key }") };
}

/**
 * The findings with their holders: one more pass over the references, judged as the sessions
 * judge them (only when a finding's holders depend on them), and the lease records of the nodes
 * whose references were found.
 */
async function* withHolders(
  ctx: KvContext,
  stats: KvStats,
  pending: readonly Pending[],
  signal: AbortSignal,
): AsyncGenerator<DamageFinding> {
  const use = new LiveUse();
  for (const p of pending) {
    if (p.id !== undefined) use.watchId(p.id);
    if (p.key !== undefined) use.watchKey(p.key);
  }
  if (!use.empty) {
    for await (const ref of new KvAdmin(ctx).references(signal)) if (ref.live) use.note(ref);
  }
  const nodes = pending.flatMap((p) => p.node === undefined ? [] : [p.node]);
  const leases = await readLeases(ctx, stats, nodes, signal);
  const now = ctx.settings.now();
  for (const p of pending) {
    const live = p.node !== undefined &&
      nodeIsLive(leases.get(p.node), now, ctx.settings.maxClockSkewMs);
    yield heldBy(p.finding, holdersOf(p, use, live));
  }
}

/** The holders of a finding: its reference's node while live, the nodes using its ID or key. */
export function holdersOf(p: Pending, use: LiveUse, nodeLive: boolean): string[] {
  return [
    ...(nodeLive && p.node !== undefined ? [p.node] : []),
    ...(p.id === undefined ? [] : use.holdersOfId(p.id)),
    ...(p.key === undefined ? [] : use.holdersOfKey(p.key)),
  ];
}

/**
 * Deletes the entry of `finding` if its versionstamp is still the listed one and no live node
 * holds it. Returns whether it deleted. Throws {@linkcode InvalidOptionsError} for a token not
 * issued for this prefix, and {@linkcode LiveEntryError} for an entry the listing found held, or
 * one a live node holds now:
 * - a reference whose node's lease is live (the commit also checks that lease record, so a node
 *   that comes back meanwhile makes it fail);
 * - a key index or touch counter of a key with live references (the commit also checks the touch
 *   counter, which every writer of a reference changes).
 *
 * A master that live references name was reported held by the listing; between the listing and
 * this call a node can only come to name a corrupt master's ID by repairing the master, which
 * changes its versionstamp, so the guard keeps it.
 */
export async function removeDamage(
  ctx: KvContext,
  stats: KvStats,
  finding: Pick<DamageFinding, "token">,
  signal: AbortSignal,
): Promise<boolean> {
  const { layout } = ctx;
  const parsed = tokenSchema.safeParse(decodeToken(finding.token, TAG));
  if (!parsed.success) {
    throw new InvalidOptionsError("not a damage token of a Deno KV store", {
      cause: parsed.error,
    });
  }
  const key = parsed.data.key.map(fromPart);
  const family = key[layout.prefix.length];
  if (!layout.contains(key) || typeof family !== "string" || !FAMILIES.has(family)) {
    throw new InvalidOptionsError(
      `damage token names ${formatKey(key)}, which is not an entry of this store's layout`,
    );
  }
  if (parsed.data.held !== undefined) throw new LiveEntryError(formatKey(key), parsed.data.held);
  const guard = { key, versionstamp: parsed.data.versionstamp };
  const id = layout.parseId(key);
  // A master's deletion is logged, so watchers drop a master they had cached (an oversized one).
  const op = id === undefined ? ctx.kv.atomic() : loggedAtomic(ctx, [{ id, key: null }]);
  op.check(guard).delete(key);
  await guardHolders(ctx, stats, key, op, signal);
  const ok = id === undefined
    ? (await commit(stats, op, signal)).ok
    : (await commitLogged(ctx, stats, op, signal)).ok;
  log.info("{what} damaged entry {key} ({kind})", {
    what: ok ? "removed" : "entry changed since it was listed; kept",
    key: formatKey(key),
    kind: parsed.data.kind,
  });
  return ok;
}

/**
 * Throws {@linkcode LiveEntryError} when a live node holds the entry at `key` (see
 * {@linkcode removeDamage}); otherwise adds to `op` the checks that fail its commit if one comes
 * to hold it meanwhile.
 */
async function guardHolders(
  ctx: KvContext,
  stats: KvStats,
  key: Deno.KvKey,
  op: Deno.AtomicOperation,
  signal: AbortSignal,
): Promise<void> {
  const { layout, settings } = ctx;
  const held = (holders: string[]) => {
    if (holders.length === 0) return;
    log.info("kept damaged entry {key}: held by {holders}", { key: formatKey(key), holders });
    throw new LiveEntryError(formatKey(key), holders);
  };
  const ref = layout.parseRef(key);
  if (ref !== undefined) {
    const lease = (await readLeases(ctx, stats, [ref.node], signal)).get(ref.node);
    held(nodeIsLive(lease, settings.now(), settings.maxClockSkewMs) ? [ref.node] : []);
    op.check({ key: layout.lease(ref.node), versionstamp: lease?.versionstamp ?? null });
    return;
  }
  const of = layout.parseKeyOf(key, "key") ?? layout.parseKeyOf(key, "touch");
  if (of === undefined) return;
  // The touch counter first: a reference written after it was read changes it (GC does the same).
  const touch = await get(ctx, stats, layout.touch(of), signal);
  const live = await liveRefs(ctx, stats, await readRefs(ctx, stats, of, signal), signal);
  held([...new Set(live.map((r) => r.node))].sort());
  op.check({ key: layout.touch(of), versionstamp: touch.versionstamp });
}

/** The families of the layout (`layout.ts`): the only entries a token may name. */
const FAMILIES = new Set(["id", "key", "touch", "ref", "lease", "log", "gen"]);

function finding(
  entry: Deno.KvEntry<unknown>,
  kind: DamageKind,
  reason: string,
  about: { readonly id?: number; readonly key?: string; readonly node?: string } = {},
): DamageFinding {
  return {
    kind,
    entry: formatKey(entry.key),
    reason,
    ...(about.id === undefined ? {} : { id: about.id }),
    ...(about.key === undefined ? {} : { key: shorten(about.key) }),
    ...(about.node === undefined ? {} : { node: shorten(about.node) }),
    token: encodeToken(TAG, {
      key: entry.key.map(toPart),
      versionstamp: entry.versionstamp,
      kind,
    }),
  };
}

type Part = z.infer<typeof partSchema>;

function toPart(p: Deno.KvKeyPart): Part {
  if (typeof p === "string") return { s: p };
  if (typeof p === "number") return { n: p };
  if (typeof p === "bigint") return { i: String(p) };
  if (typeof p === "boolean") return { t: p };
  if (p instanceof Uint8Array) return { u: Buffer.from(p).toString("base64") };
  // Listed keys hold no other part types.
  return { s: String(p) };
}

function fromPart(p: Part): Deno.KvKeyPart {
  if ("s" in p) return p.s;
  if ("n" in p) return p.n;
  if ("i" in p) return BigInt(p.i);
  if ("t" in p) return p.t;
  return new Uint8Array(Buffer.from(p.u, "base64"));
}
