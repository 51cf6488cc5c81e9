/**
 * Which keys the etcd layout can hold, shared by `checkKey` (before a write) and by GC and the
 * damage report (a master naming a key that fails it was written by someone else, and its
 * references cannot be read safely: GC skips it).
 *
 * @example
 * ```ts
 * import { EtcdLayout } from "./paths.ts";
 * import { keyProblem } from "./key_check.ts";
 * const layout = new EtcdLayout("cilium/state/identities/v1");
 * console.log(keyProblem(layout, "k8s:app=web;")); // undefined
 * console.log(keyProblem(layout, "../id/5")); // why it cannot be stored
 * ```
 *
 * @module
 */
import { MAX_KEY_BYTES, utf8Length } from "./limits.ts";
import type { EtcdLayout } from "./paths.ts";

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
