/**
 * The order of master versions on the stores whose versions have one: etcd's mod revisions
 * (decimal, no leading zeros) and Deno KV's versionstamps (fixed-width hex) both order by length,
 * then text. (Kubernetes' resource versions have none the API allows to use.)
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { newerOrderedVersion } from "./versions.ts";
 *
 * assert.equal(newerOrderedVersion("10", "9"), true);
 * assert.equal(newerOrderedVersion("00000000000000000a00", "00000000000000000900"), true);
 * assert.equal(newerOrderedVersion("9", "9"), false);
 * ```
 *
 * @module
 */

/** Whether version `a` is newer than `b` (see the module doc): `BackendSession.newerVersion`. */
export function newerOrderedVersion(a: string, b: string): boolean {
  return a.length !== b.length ? a.length > b.length : a > b;
}
