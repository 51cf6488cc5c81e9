/**
 * The damage report: entries under a store's namespace that idalloc cannot use (written by hand,
 * by a broken tool, by an attacker), listed by a backend and removed one by one on request.
 *
 * Damage never stops idalloc: GC and watches skip what they cannot read and count it
 * ({@linkcode GcSkip}). The report is for an operator (`idalloc doctor`): a backend that
 * implements {@linkcode StoreDoctor} lists {@linkcode DamageFinding}s, and
 * {@linkcode StoreDoctor.removeDamage} deletes one only if the entry is unchanged since it was
 * listed (the store's own guard), so a finding that someone repaired or rewrote meanwhile is left
 * alone.
 *
 * @example List the damage of a store and remove it
 * ```ts
 * import assert from "node:assert/strict";
 * import { DenoKvBackend, isStoreDoctor } from "@idalloc/idalloc";
 *
 * using kv = await Deno.openKv(":memory:");
 * await kv.set(["ids", "id", 7], "garbage");
 * const backend = new DenoKvBackend(kv, { prefix: ["ids"], node: "doctor" });
 * assert.ok(isStoreDoctor(backend));
 * const kinds: string[] = [];
 * for await (const finding of backend.findDamage({ range: { min: 1, max: 1000 } })) {
 *   kinds.push(finding.kind);
 *   assert.equal(await backend.removeDamage(finding), true);
 * }
 * assert.deepEqual(kinds, ["master-undecodable"]);
 * assert.equal((await kv.get(["ids", "id", 7])).value, null);
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { IdRange } from "./id_space.ts";

/**
 * Damage every backend's layout can hold, whatever the store: its masters (ID → key) and its
 * references (key and node → ID). Each kind with what it means.
 */
export const CORE_DAMAGE_KINDS: Readonly<Record<CoreDamageKind, string>> = {
  "master-bad-id":
    "a master key whose ID part is not a non-negative safe integer (or whose key has the wrong shape)",
  "master-undecodable":
    "a master whose value is not a key (not the expected shape, not valid UTF-8)",
  "master-oversized":
    "a master whose key is too large for the layout (no reference or index of it can be stored), " +
    "or whose entry alone exceeds a response limit",
  "reference-bad-key": "a reference key without the `<key>/<node>` shape",
  "reference-undecodable": "a reference whose value is not an ID",
  "reference-out-of-range": "a reference naming an ID outside every valid range of the scan",
};

/** The kinds of {@linkcode CORE_DAMAGE_KINDS}. */
export type CoreDamageKind =
  | "master-bad-id"
  | "master-undecodable"
  | "master-oversized"
  | "reference-bad-key"
  | "reference-undecodable"
  | "reference-out-of-range";

/**
 * What is wrong with an entry: a core kind ({@linkcode CORE_DAMAGE_KINDS}), or one of the kinds
 * the store's backend declares for entries only its layout has (its driver's `damageKinds`:
 * Deno KV's `index-orphan`, `counter-wrong-type`, …; etcd's `master-empty`,
 * `reference-without-lease`). The list is open so that a backend adds kinds without changing the
 * core; a consumer that switches on the kind keeps a default branch. (`string & Record<never,
 * never>` keeps editors suggesting the core kinds.)
 */
export type DamageKind = CoreDamageKind | (string & Record<never, never>);

/** An entry that GC skipped as damaged (it is neither judged nor collected). */
export interface GcSkip {
  /** What is wrong with it. */
  readonly kind: DamageKind;
  /** The entry in a readable form (the etcd key, or the Deno KV key tuple), shortened if huge. */
  readonly entry: string;
  /** Why it was skipped, in one sentence. */
  readonly reason: string;
}

/** One damaged entry found by {@linkcode StoreDoctor.findDamage}. */
export interface DamageFinding extends GcSkip {
  /** The ID the entry names or belongs to, when it has a usable one. */
  readonly id?: number;
  /** The encoded key the entry belongs to, when known (shortened if huge). */
  readonly key?: string;
  /** The node of a reference entry, when its key names one. */
  readonly node?: string;
  /**
   * The live nodes that hold the entry, sorted; absent when none does. An entry is held when it
   * is bound to a live etcd lease, when it is a Deno KV reference of a node whose lease is live,
   * or when it belongs to an ID or key that live references name. Such an entry is damaged but in
   * use: {@linkcode StoreDoctor.removeDamage} refuses it ({@linkcode LiveEntryError}), because
   * deleting it would take an ID from under a running node. An etcd lease that no reference
   * names is shown as `lease <id>`.
   */
  readonly heldBy?: readonly string[];
  /**
   * Names the exact entry and the version it was listed at, for
   * {@linkcode StoreDoctor.removeDamage}. Opaque, but plain text: it survives JSON and a command
   * line, so a listing can be acted on by another process.
   */
  readonly token: string;
}

/**
 * Where a stored ID (prefix mask applied) may validly be: every range an allocator sharing the
 * prefix allocates from, or a function giving them for one encoded key (an identity's label-set
 * key may be in every cluster's range, a plain key only in its allocator's). An ID inside any of
 * them is not damage.
 */
export type ValidRanges = readonly IdRange[] | ((key: string) => readonly IdRange[]);

/** Options of {@linkcode StoreDoctor.findDamage}. */
export interface DamageScanOptions {
  /**
   * The stored IDs in use (prefix mask applied): one valid range, the same as `ranges: [range]`.
   * With it (or `ranges`), references and key indexes naming an ID outside every valid range
   * are reported too; without either, only what is damaged for any range.
   */
  readonly range?: IdRange;
  /** Every valid range (see {@linkcode ValidRanges}); an ID in any of them, or in `range`, is valid. */
  readonly ranges?: ValidRanges;
  /** Aborts the scan. */
  readonly signal?: AbortSignal;
}

/** A backend that can list the damage under its namespace and remove it. */
export interface StoreDoctor {
  /**
   * Lists every damaged entry under the namespace. Reads only; safe while nodes run. Entries that
   * are merely stale (dead references, expired leases) are GC's business and not reported.
   */
  findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding>;
  /**
   * Deletes the entry of `finding` if it is unchanged since it was listed and no live node holds
   * it. Returns whether it deleted. Throws {@linkcode LiveEntryError} for an entry the listing
   * found held (see {@linkcode DamageFinding.heldBy}; its token records that: list again once the
   * holders are gone) or that a live node holds now (references, and on Deno KV key indexes and
   * counters, are judged again at the removal, as a node may have come back since the listing),
   * and {@linkcode InvalidOptionsError} for a token that this store did not issue (of another
   * backend, outside the namespace, or mangled).
   */
  removeDamage(
    finding: Pick<DamageFinding, "token">,
    options?: { readonly signal?: AbortSignal },
  ): Promise<boolean>;
}

/** Whether `backend` implements {@linkcode StoreDoctor}. */
export function isStoreDoctor(backend: unknown): backend is StoreDoctor {
  const b = backend as Partial<StoreDoctor> | null;
  return typeof b === "object" && b !== null && typeof b.findDamage === "function" &&
    typeof b.removeDamage === "function";
}

/** Longest text of an entry or key shown in a finding; longer ones are shortened. */
export const SHOWN_CHARS = 200;

/** `text`, shortened to {@linkcode SHOWN_CHARS} with its full length noted. */
export function shorten(text: string): string {
  if (text.length <= SHOWN_CHARS) return text;
  return `${text.slice(0, SHOWN_CHARS)}… (${text.length} chars)`;
}

/** A finding's token: `<backend>:` and its payload as base64url JSON (plain text, no spaces). */
export function encodeToken(backend: string, payload: unknown): string {
  return `${backend}:${Buffer.from(JSON.stringify(payload), "utf8").toString("base64url")}`;
}

/** The payload of a token made by {@linkcode encodeToken} for `backend`, or `undefined`. */
export function decodeToken(token: unknown, backend: string): unknown {
  if (typeof token !== "string" || !token.startsWith(`${backend}:`)) return undefined;
  try {
    return JSON.parse(Buffer.from(token.slice(backend.length + 1), "base64url").toString("utf8"));
  } catch {
    return undefined;
  }
}

/** `ranges` sorted, with overlapping and adjacent ones joined. */
export function mergeRanges(ranges: Iterable<IdRange>): IdRange[] {
  const sorted = [...ranges].sort((a, b) => a.min - b.min || a.max - b.max);
  const out: { min: number; max: number }[] = [];
  for (const { min, max } of sorted) {
    const last = out.at(-1);
    if (last !== undefined && min <= last.max + 1) last.max = Math.max(last.max, max);
    else out.push({ min, max });
  }
  return out;
}

/** The valid ranges of a scan, resolved per key (see {@linkcode DamageScanOptions}). */
export interface RangeCheck {
  /** Whether `id`, stored for the encoded `key`, lies in one of the key's valid ranges. */
  valid(id: number, key: string): boolean;
  /** A finding's reason for `id` of `key`, naming the valid ranges. */
  outside(id: number, key: string): string;
}

/** The range check of `options`, or `undefined` when the scan has no range. */
export function rangeCheck(options: DamageScanOptions): RangeCheck | undefined {
  const { range, ranges } = options;
  if (range === undefined && ranges === undefined) return undefined;
  const fixed = range === undefined ? [] : [range];
  // Most keys share their ranges (a function returns one of a few arrays): each distinct set is
  // merged once.
  const merged = new WeakMap<readonly IdRange[], IdRange[]>();
  const resolve = (given: readonly IdRange[]): IdRange[] => {
    let out = merged.get(given);
    if (!out) merged.set(given, out = mergeRanges([...fixed, ...given]));
    return out;
  };
  const constant = typeof ranges === "function" ? undefined : resolve(ranges ?? []);
  const rangesOf = (key: string) =>
    constant ?? resolve((ranges as (key: string) => readonly IdRange[])(key));
  return {
    valid: (id, key) => rangesOf(key).some((r) => id >= r.min && id <= r.max),
    outside: (id, key) => {
      const shown = rangesOf(key).map((r) => `[${r.min}, ${r.max}]`);
      return `ID ${id} is outside ${shown.length === 1 ? "the valid range" : "every valid range"} ${
        shown.join(", ") || "(none)"
      }`;
    },
  };
}

/**
 * Who holds the IDs and keys of a scan's findings: a backend registers the IDs and keys it needs
 * to judge, passes every live reference it reads to {@linkcode LiveUse.note}, and asks for the
 * nodes afterwards. Only registered IDs and keys are kept, so one pass over a large store costs
 * little memory.
 */
export class LiveUse {
  readonly #ids = new Map<number, Set<string>>();
  readonly #keys = new Map<string, Set<string>>();

  /** Judge the holders of `id`. */
  watchId(id: number): void {
    if (!this.#ids.has(id)) this.#ids.set(id, new Set());
  }

  /** Judge the holders of the encoded `key`. */
  watchKey(key: string): void {
    if (!this.#keys.has(key)) this.#keys.set(key, new Set());
  }

  /** Whether nothing is registered (then no pass over the references is needed). */
  get empty(): boolean {
    return this.#ids.size === 0 && this.#keys.size === 0;
  }

  /** Records one live reference. */
  note(ref: { readonly key: string; readonly node: string; readonly id: number }): void {
    this.#ids.get(ref.id)?.add(ref.node);
    this.#keys.get(ref.key)?.add(ref.node);
  }

  /** The nodes whose live references name `id`, sorted. */
  holdersOfId(id: number): string[] {
    return [...this.#ids.get(id) ?? []].sort();
  }

  /** The nodes with a live reference to the encoded `key`, sorted. */
  holdersOfKey(key: string): string[] {
    return [...this.#keys.get(key) ?? []].sort();
  }
}

/**
 * `finding` with `heldBy` set to `holders` (sorted, deduplicated), or as is when there are none.
 * The token records them too (as `held`), so that a removal refuses the entry whatever the
 * backend can judge again at that point (an etcd master's holders take a full read to find).
 */
export function heldBy(finding: DamageFinding, holders: Iterable<string>): DamageFinding {
  const nodes = [...new Set(holders)].sort();
  if (nodes.length === 0) return finding;
  const tag = finding.token.slice(0, finding.token.indexOf(":"));
  const payload = decodeToken(finding.token, tag) as Record<string, unknown>;
  return { ...finding, heldBy: nodes, token: encodeToken(tag, { ...payload, held: nodes }) };
}
