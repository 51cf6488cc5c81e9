/**
 * The Deno KV data layout: tuple keys under a configurable prefix `P`. Keys are tuples, never
 * `/`-joined paths, so one key can never be mistaken for a prefix of another (Cilium's
 * prefix-match bug cannot happen here).
 *
 * ```text
 * [...P, "id", N]                  → { key: string }             master of ID N. No expiry.
 * [...P, "key", k]                 → { id: N }                   key index of key k. No expiry.
 * [...P, "touch", k]               → Deno.KvU64(0)               acquire stamp of key k. No expiry.
 * [...P, "ref", k, node]           → { id: N, lease: string }    node's reference to k. No expiry.
 * [...P, "lease", node]            → { lease: string, expiresAt: ms }   expireIn = ttl + 2 × skew
 * [...P, "log", ms, node, nonce]   → { id: N, key: string | null }      expireIn = log retention
 * [...P, "gen"]                    → Deno.KvU64                  number of log entries ever written
 * ```
 *
 * Invariants the protocol keeps:
 * - The master and the key index are written in the same commit and deleted in the same commit,
 *   so they always share one versionstamp. The key index is the single source of truth for
 *   key → ID: a stale unreferenced master is found through it and reused, never duplicated.
 *   Neither is ever rewritten to point elsewhere.
 * - Every acquire rewrites the key's touch entry with a blind `set` (no check, so acquirers of one
 *   key never conflict with each other; and unlike a `sum`, no value found there can make the
 *   commit fail). Only its versionstamp matters: a GC delete checks it. Deno KV has no range
 *   checks, and this single key is where GC and acquirers collide.
 * - A reference is live iff its node's lease record exists, carries the same `lease` id, and
 *   `expiresAt + maxClockSkewMs > now`. `expireIn` is only a backstop: an expired entry stays
 *   readable (locally about 60 s), so liveness is always judged from `expiresAt`.
 * - Every commit that creates or deletes a master also writes one log entry per master (with
 *   `key: null` for a delete) and adds the number of entries to `gen`. Watchers poll `gen`, read
 *   the time-keyed log since their last poll, and compare the count with `gen`'s increase to
 *   detect missed entries (then they re-list).
 * - That `sum` on `gen` is the only mutation of any commit that a stored value can make fail, and
 *   it is the first of its commit: Deno KV keeps the mutations applied before a failing one
 *   (`docs/deno-kv-partial-commit.md`), so a corrupt `gen` leaves nothing half-written. It is
 *   then reset (guarded) and the commit retried (`client.ts`).
 *
 * @module
 */
import { MAX_KEY_BYTES } from "./limits.ts";

/** A key part this backend writes: strings and numbers only. */
export type LayoutPart = string | number;

/** Builds and parses the backend's keys under one prefix. */
export class KvLayout {
  /** The prefix every key starts with. */
  readonly prefix: readonly LayoutPart[];
  /** Encoded size of the prefix in bytes. */
  readonly prefixBytes: number;

  /** @param prefix the namespace, already validated */
  constructor(prefix: readonly LayoutPart[]) {
    this.prefix = [...prefix];
    this.prefixBytes = this.prefix.reduce((n: number, p) => n + partBytes(p), 0);
  }

  /** Master of ID `id`. */
  id(id: number): Deno.KvKey {
    return [...this.prefix, "id", id];
  }

  /** Prefix of all masters. */
  ids(): Deno.KvKey {
    return [...this.prefix, "id"];
  }

  /** Key index of key `key`. */
  key(key: string): Deno.KvKey {
    return [...this.prefix, "key", key];
  }

  /** Touch counter of key `key`. */
  touch(key: string): Deno.KvKey {
    return [...this.prefix, "touch", key];
  }

  /** Node `node`'s reference to `key`. */
  ref(key: string, node: string): Deno.KvKey {
    return [...this.prefix, "ref", key, node];
  }

  /** Prefix of every reference to `key`. */
  refsOf(key: string): Deno.KvKey {
    return [...this.prefix, "ref", key];
  }

  /** Prefix of all references. */
  refs(): Deno.KvKey {
    return [...this.prefix, "ref"];
  }

  /** Lease record of node `node`. */
  lease(node: string): Deno.KvKey {
    return [...this.prefix, "lease", node];
  }

  /** Prefix of all lease records. */
  leases(): Deno.KvKey {
    return [...this.prefix, "lease"];
  }

  /** One change-feed entry. */
  log(ms: number, node: string, nonce: string): Deno.KvKey {
    return [...this.prefix, "log", ms, node, nonce];
  }

  /** Prefix of the change feed. */
  logs(): Deno.KvKey {
    return [...this.prefix, "log"];
  }

  /** The change counter. */
  gen(): Deno.KvKey {
    return [...this.prefix, "gen"];
  }

  /**
   * The ID of a master key, or `undefined` if `key` is not `[...P, "id", N]` with N a
   * non-negative safe integer (a foreign or corrupt entry).
   */
  parseId(key: Deno.KvKey): number | undefined {
    const n = this.prefix.length;
    if (key.length !== n + 2 || key[n] !== "id") return undefined;
    const id = key[n + 1];
    return typeof id === "number" && Number.isSafeInteger(id) && id >= 0 ? id : undefined;
  }

  /** Key and node of a reference key, or `undefined` if `key` is not `[...P, "ref", k, node]`. */
  parseRef(key: Deno.KvKey): { key: string; node: string } | undefined {
    const n = this.prefix.length;
    if (key.length !== n + 3 || key[n] !== "ref") return undefined;
    const [k, node] = [key[n + 1], key[n + 2]];
    if (typeof k !== "string" || typeof node !== "string" || k === "" || node === "") {
      return undefined;
    }
    return { key: k, node };
  }

  /** The node of a lease record key, or `undefined` if `key` is not `[...P, "lease", node]`. */
  parseLease(key: Deno.KvKey): string | undefined {
    const n = this.prefix.length;
    if (key.length !== n + 2 || key[n] !== "lease") return undefined;
    const node = key[n + 1];
    return typeof node === "string" && node !== "" ? node : undefined;
  }

  /**
   * The key `k` of an entry `[...P, family, k]` (a key index or a touch entry), or `undefined` if
   * `key` does not have that shape.
   */
  parseKeyOf(key: Deno.KvKey, family: "key" | "touch"): string | undefined {
    const n = this.prefix.length;
    if (key.length !== n + 2 || key[n] !== family) return undefined;
    const k = key[n + 1];
    return typeof k === "string" && k !== "" ? k : undefined;
  }

  /** Whether `key` lies under the prefix (its parts equal the prefix's, in order). */
  contains(key: Deno.KvKey): boolean {
    return key.length > this.prefix.length && this.prefix.every((p, i) => key[i] === p);
  }

  /** Whether `key` has the shape `[...P, "log", ms, node, nonce]`. */
  isLog(key: Deno.KvKey): boolean {
    const n = this.prefix.length;
    return key.length === n + 4 && key[n] === "log" && typeof key[n + 1] === "number" &&
      typeof key[n + 2] === "string" && typeof key[n + 3] === "string";
  }

  /**
   * Whether every per-key entry of `key` (key index, touch, the reference prefix) fits the store's
   * key limit, whatever the node. A master naming a key that does not fit was never written by
   * idalloc (`checkKey` refuses such keys), and nothing of it can be read: GC skips it.
   */
  fitsKey(key: string): boolean {
    return keyBytes(this.touch(key)) <= MAX_KEY_BYTES;
  }

  /**
   * Encoded size in bytes of the largest key the layout writes for `key`: the reference
   * `[...P, "ref", key, node]` (the log key does not contain `key`).
   */
  largestKeyBytes(key: string, node: string): number {
    return this.prefixBytes + partBytes("ref") + partBytes(key) + partBytes(node);
  }
}

/**
 * Encoded size of one key part, as the store counts it: a string is a type byte, its UTF-8 bytes
 * with every NUL escaped to two bytes, and a terminator; a number is a type byte and 8 bytes.
 * Measured against the store's own `Key too large` limit.
 */
export function partBytes(part: LayoutPart): number {
  if (typeof part === "number") return 9;
  let nul = 0;
  for (let i = part.indexOf("\0"); i !== -1; i = part.indexOf("\0", i + 1)) nul++;
  return 2 + utf8.encode(part).length + nul;
}

/** Encoded size of a key written by this backend (strings and numbers only). */
export function keyBytes(key: Deno.KvKey): number {
  let n = 0;
  for (const part of key) {
    n += typeof part === "string" || typeof part === "number" ? partBytes(part) : 64;
  }
  return n;
}

/** Whether a prefix leaves room for a reference key with a 1-char key and the given node. */
export function prefixFits(prefix: readonly LayoutPart[], node: string): boolean {
  return new KvLayout(prefix).largestKeyBytes("x", node) <= MAX_KEY_BYTES;
}

const utf8 = new TextEncoder();
