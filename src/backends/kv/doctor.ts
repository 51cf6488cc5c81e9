/**
 * The damage report on Deno KV ({@linkcode StoreDoctor}): one read-only walk over every family of
 * the layout, reporting entries idalloc cannot use, and a guarded delete of one of them.
 *
 * Reported: masters with a bad ID, an unreadable value or a key too large for the layout; key
 * indexes that cannot be read or that name an ID without a matching master (or outside the range);
 * references that cannot be read (or name an ID outside the range); counters (`gen`, `touch`) that
 * do not hold a `Deno.KvU64`; lease records and change-feed entries of the wrong shape. Dead
 * references and expired lease records are stale, not damaged: GC sweeps them.
 *
 * A removal checks the versionstamp the entry was listed with. Deleting a master also writes its
 * change-feed entry, so watchers drop it from their caches at once.
 *
 * @example
 * ```ts ignore
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
import { decodeToken, encodeToken, shorten } from "../../allocator/damage.ts";
import { InvalidOptionsError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import {
  commit,
  commitLogged,
  get,
  getMany,
  type KvContext,
  type KvStats,
  list,
  loggedAtomic,
} from "./io.ts";
import { LIST_BATCH, MAX_GET_MANY } from "./limits.ts";
import { formatKey, peek } from "./schema.ts";

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
});

/** Lists every damaged entry under the prefix (see the module doc). */
export async function* findDamage(
  ctx: KvContext,
  stats: KvStats,
  options: DamageScanOptions = {},
): AsyncGenerator<DamageFinding> {
  const signal = options.signal ?? new AbortController().signal;
  const { layout } = ctx;
  const range = options.range;
  const inRange = (id: number) => range === undefined || (id >= range.min && id <= range.max);
  const entries = (family: string) =>
    list(ctx, stats, { prefix: [...layout.prefix, family] }, signal, LIST_BATCH);

  for await (const e of entries("id")) {
    const id = layout.parseId(e.key);
    if (id === undefined) {
      yield finding(e, "master-bad-id", "the ID is not a non-negative safe integer");
      continue;
    }
    const value = peek.master(e.value);
    if (value === undefined) {
      yield finding(e, "master-undecodable", "the value is not { key: string }", { id });
    } else if (!layout.fitsKey(value.key)) {
      yield finding(e, "master-oversized", "its key is too large for the layout", {
        id,
        key: value.key,
      });
    }
  }

  // Key indexes are judged against their masters, read ten at a time.
  let indexes: { entry: Deno.KvEntry<unknown>; key: string; id: number }[] = [];
  const judgeIndexes = async function* (): AsyncGenerator<DamageFinding> {
    const masters = await getMany(ctx, stats, indexes.map((x) => layout.id(x.id)), signal);
    for (const [i, { entry, key, id }] of indexes.entries()) {
      const master = masters[i];
      const owner = master.versionstamp === null ? undefined : peek.master(master.value);
      if (!inRange(id)) {
        yield finding(entry, "index-orphan", `it names ID ${id}, outside the range`, { id, key });
      } else if (master.versionstamp === null) {
        yield finding(entry, "index-orphan", `it names ID ${id}, which has no master`, { id, key });
      } else if (owner !== undefined && owner.key !== key) {
        yield finding(entry, "index-orphan", `it names ID ${id}, whose master is another key's`, {
          id,
          key,
        });
      }
      // A master that cannot be read is reported as such; the index may well be right.
    }
    indexes = [];
  };
  for await (const e of entries("key")) {
    const key = layout.parseKeyOf(e.key, "key");
    const value = peek.keyIndex(e.value);
    if (key === undefined || value === undefined) {
      yield finding(e, "index-undecodable", "not a key index { id }", { key });
      continue;
    }
    indexes.push({ entry: e, key, id: value.id });
    if (indexes.length >= MAX_GET_MANY) yield* judgeIndexes();
  }
  if (indexes.length > 0) yield* judgeIndexes();

  for await (const e of entries("touch")) {
    const key = layout.parseKeyOf(e.key, "touch");
    if (key === undefined || !(e.value instanceof Deno.KvU64)) {
      yield finding(e, "counter-wrong-type", "a touch entry must hold a Deno.KvU64", { key });
    }
  }
  const gen = await get(ctx, stats, layout.gen(), signal);
  if (gen.versionstamp !== null && !(gen.value instanceof Deno.KvU64)) {
    yield finding(gen as Deno.KvEntry<unknown>, "counter-wrong-type", "gen must hold a Deno.KvU64");
  }

  for await (const e of entries("ref")) {
    const parsed = layout.parseRef(e.key);
    if (parsed === undefined) {
      yield finding(e, "reference-bad-key", "not a [ref, key, node] key");
      continue;
    }
    const value = peek.ref(e.value);
    if (value === undefined) {
      yield finding(e, "reference-undecodable", "the value is not { id, lease }", {
        key: parsed.key,
      });
    } else if (!inRange(value.id)) {
      yield finding(e, "reference-out-of-range", `it names ID ${value.id}, outside the range`, {
        id: value.id,
        key: parsed.key,
      });
    }
  }

  for await (const e of entries("lease")) {
    if (layout.parseLease(e.key) === undefined || peek.lease(e.value) === undefined) {
      yield finding(e, "lease-undecodable", "not a lease record { lease, expiresAt }");
    }
  }

  for await (const e of entries("log")) {
    if (!layout.isLog(e.key) || peek.log(e.value) === undefined) {
      yield finding(e, "log-undecodable", "not a change-feed entry { id, key }");
    }
  }
}

/**
 * Deletes the entry of `finding` if its versionstamp is still the listed one. Returns whether it
 * deleted. Throws {@linkcode InvalidOptionsError} for a token not issued for this prefix.
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
  const guard = { key, versionstamp: parsed.data.versionstamp };
  const id = layout.parseId(key);
  // A master's deletion is logged, so watchers drop a master they had cached (an oversized one).
  const op = id === undefined ? ctx.kv.atomic() : loggedAtomic(ctx, [{ id, key: null }]);
  op.check(guard).delete(key);
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

/** The families of the layout (`layout.ts`): the only entries a token may name. */
const FAMILIES = new Set(["id", "key", "touch", "ref", "lease", "log", "gen"]);

function finding(
  entry: Deno.KvEntry<unknown>,
  kind: DamageKind,
  reason: string,
  about: { readonly id?: number; readonly key?: string } = {},
): DamageFinding {
  return {
    kind,
    entry: formatKey(entry.key),
    reason,
    ...(about.id === undefined ? {} : { id: about.id }),
    ...(about.key === undefined ? {} : { key: shorten(about.key) }),
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
