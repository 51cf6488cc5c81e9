/**
 * Cilium's etcd key layout, built with Go's `path.Join`/`path.Clean` semantics so that idalloc and
 * Cilium's Go allocator name every key byte for byte the same.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { EtcdLayout, prefixMatchesKey } from "./layout.ts";
 * const layout = new EtcdLayout("cilium/state/identities/v1");
 * // Cleaned as Go does.
 * assert.equal(
 *   layout.refKey("unspec:a=b//c;", "10.0.0.1"),
 *   "cilium/state/identities/v1/value/unspec:a=b/c;/10.0.0.1",
 * );
 * assert.equal(prefixMatchesKey(layout.refPrefix("a;"), layout.refKey("a;/b;", "n1")), false);
 * ```
 *
 * {@linkcode keyProblem} tells which keys the layout can hold, for `checkKey` (before a write) and
 * for GC and the damage report (a master naming a key that fails it was written by someone else,
 * and its references cannot be read safely: GC skips it):
 *
 * ```ts
 * import assert from "node:assert/strict";
 * import { EtcdLayout, keyProblem } from "./layout.ts";
 * const layout = new EtcdLayout("cilium/state/identities/v1");
 * assert.equal(keyProblem(layout, "k8s:app=web;"), undefined);
 * // Go's path cleaning would store it as a master: refused, with the reason.
 * assert.match(keyProblem(layout, "../id/5") ?? "", /leaves '.*\/value\/' after Go path cleaning/);
 * ```
 *
 * @module
 */
import { MAX_KEY_BYTES, utf8Length } from "./limits.ts";

/** Matches a path that `path.Clean` would change (`""` aside). */
const NOT_CLEAN = /\/\/|(?:^|\/)\.\.?(?:\/|$)|.\/$/s;

/**
 * Go's `path.Clean`: the shortest path equivalent to `p` by purely lexical processing (collapse
 * `//`, drop `.`, resolve `..`, no trailing `/`; `""` becomes `"."`).
 */
export function goClean(p: string): string {
  if (p === "") return ".";
  // Already clean (the usual case on the allocation path): no `//`, no `.` or `..` element, no
  // trailing `/` other than the root.
  if (!NOT_CLEAN.test(p)) return p;
  const rooted = p.startsWith("/");
  const out: string[] = [];
  for (const part of p.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") {
      if (out.length > 0 && out[out.length - 1] !== "..") out.pop();
      else if (!rooted) out.push("..");
      continue;
    }
    out.push(part);
  }
  const joined = out.join("/");
  if (rooted) return "/" + joined;
  return joined === "" ? "." : joined;
}

/** Go's `path.Join`: joins the non-empty elements with `/` and cleans the result. */
export function goJoin(...elems: string[]): string {
  const parts = elems.filter((e) => e !== "");
  if (parts.length === 0) return "";
  return goClean(parts.join("/"));
}

/**
 * Cilium's `prefixMatchesKey`: a reference key belongs to the key whose reference prefix is
 * `prefix` only if its last `/` sits right after the prefix. `value/a;/n1` matches `value/a;`,
 * `value/a;/b;/n1` does not (it is a reference of the key `a;/b;`).
 */
export function prefixMatchesKey(prefix: string, key: string): boolean {
  return key.lastIndexOf("/") === prefix.length;
}

/** Go's `strconv.ParseUint(s, 10, 64)` restricted to safe integers; `undefined` if invalid. */
export function parseId(s: string): number | undefined {
  if (!/^[0-9]+$/.test(s)) return undefined;
  const n = Number(s);
  return Number.isSafeInteger(n) ? n : undefined;
}

/** Cilium's layout under one base prefix. */
export class EtcdLayout {
  /** The base prefix as given (Cilium's `basePrefix`). */
  readonly base: string;
  /** `path.Join(base, "id")`: master keys live under `${idPrefix}/`. */
  readonly idPrefix: string;
  /** `path.Join(base, "value")`: references live under `${valuePrefix}/`. */
  readonly valuePrefix: string;
  /** `path.Join(base, "locks")`: Cilium's etcd mutexes live under `${lockPrefix}/`. */
  readonly lockPrefix: string;

  /** @param base Cilium's base path, e.g. `cilium/state/identities/v1` */
  constructor(base: string) {
    this.base = base;
    this.idPrefix = goJoin(base, "id");
    this.valuePrefix = goJoin(base, "value");
    this.lockPrefix = goJoin(base, "locks");
  }

  /**
   * The mutex path a Cilium node locks while it allocates `key` (Cilium's `kvstoreBackend.lock`:
   * `path.Join(lockPrefix, strings.TrimPrefix(key, basePrefix))`). The mutex's keys are
   * `<path>/<lease id in hex>`.
   */
  keyLockPath(key: string): string {
    return goJoin(this.lockPrefix, trimPrefix(key, this.base));
  }

  /**
   * The mutex path Cilium's GC locks while it judges and deletes master `id` (its `RunGC` locks
   * the master key itself): `<base>/locks/id/<id>`.
   */
  idLockPath(id: number): string {
    const trimmed = trimPrefix(this.masterKey(id), this.base);
    // With a clean base the trimmed master key is `/id/<N>`: joining it is a concatenation. (This
    // runs on every write; Go's cleaning of `locks//id/N` would split the path each time.)
    if (trimmed === `/id/${id}` && this.lockPrefix !== "/") return `${this.lockPrefix}${trimmed}`;
    return goJoin(this.lockPrefix, trimmed);
  }

  /** `<base>/id/<id>`. */
  masterKey(id: number): string {
    return goJoin(this.idPrefix, String(id));
  }

  /** The start of the master range, `<idPrefix>/`. */
  get masterRange(): string {
    return this.idPrefix + "/";
  }

  /** Cilium's reference prefix of `key`: `path.Join(valuePrefix, key)` (no trailing `/`). */
  refPrefix(key: string): string {
    return goJoin(this.valuePrefix, key);
  }

  /** `path.Join(valuePrefix, key, node)`: the node's reference to `key`. */
  refKey(key: string, node: string): string {
    return goJoin(this.valuePrefix, key, node);
  }

  /** The ID of a master key, or `undefined` when the key is not `<idPrefix>/<decimal>`. */
  idOfMasterKey(etcdKey: string): number | undefined {
    if (!etcdKey.startsWith(this.masterRange)) return undefined;
    return parseId(etcdKey.slice(this.masterRange.length));
  }

  /**
   * Splits a reference key into the (cleaned) key part and the node, or `undefined` when it is not
   * under `<valuePrefix>/`.
   */
  splitRefKey(etcdKey: string): { key: string; node: string } | undefined {
    const start = this.valuePrefix + "/";
    if (!etcdKey.startsWith(start)) return undefined;
    const slash = etcdKey.lastIndexOf("/");
    if (slash < start.length) return undefined;
    return { key: etcdKey.slice(start.length, slash), node: etcdKey.slice(slash + 1) };
  }
}

/** Go's `strings.TrimPrefix`. */
function trimPrefix(s: string, prefix: string): string {
  return s.startsWith(prefix) ? s.slice(prefix.length) : s;
}

/** The exclusive end of the range of every key starting with `prefix` (etcd's prefix end). */
export function prefixEnd(prefix: Uint8Array): Uint8Array {
  // A copy (a typed-array copy, not an iteration): Buffer#slice would alias the caller's bytes.
  const end = new Uint8Array(prefix);
  for (let i = end.length - 1; i >= 0; i--) {
    if (end[i] < 0xff) {
      end[i]++;
      return end.subarray(0, i + 1);
    }
  }
  // All 0xff: the range runs to the end of the keyspace.
  return new Uint8Array([0]);
}

/**
 * Why `key` cannot be stored in `layout` whatever the node, or `undefined` if it can: empty, with
 * NUL or lone surrogates, larger than {@linkcode MAX_KEY_BYTES} (its transactions would exceed
 * etcd's 1.5 MiB request limit), or moved out of `<prefix>/value/` by Go's path cleaning.
 */
export function keyProblem(layout: EtcdLayout, key: string): string | undefined {
  if (key === "") return "key must not be empty";
  if (key.includes("\0")) return "key must not contain NUL";
  if (!key.isWellFormed()) return "key must be well-formed Unicode";
  const size = utf8Length(key);
  if (size > MAX_KEY_BYTES) {
    return `key is ${size} bytes; etcd requests (1.5 MiB) limit keys to ${MAX_KEY_BYTES} bytes`;
  }
  const refPrefix = layout.refPrefix(key);
  const base = layout.valuePrefix + "/";
  if (!refPrefix.startsWith(base) || refPrefix.length === base.length) {
    return `key '${key}' leaves '${base}' after Go path cleaning ('${refPrefix}')`;
  }
  return undefined;
}
