/**
 * The CLI's default node name, `cli-<host>-<pid>-<random>`, always valid on every backend: the
 * strictest rule is Kubernetes', whose references are annotations `ref.idalloc.io/<node>` (the
 * name part at most 63 characters of `[A-Za-z0-9-_.]`, starting and ending with a letter or
 * digit) and whose node Lease names derive from it. A host name that does not fit (EC2's
 * `ip-172-31-…compute.internal`, a pod's name in-cluster) keeps a readable prefix and has the rest
 * replaced by a hash of the whole host name, so two long host names sharing a prefix stay apart.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { defaultNodeName, MAX_NODE_NAME } from "./node_name.ts";
 *
 * assert.equal(defaultNodeName("web-1", 42, "ab12"), "cli-web-1-42-ab12");
 * const long = defaultNodeName("ip-172-31-1-1." + "x".repeat(60) + ".internal", 4194304, "ab12");
 * assert.ok(long.length <= MAX_NODE_NAME);
 * assert.match(long, /^cli-ip-172-31-1-1\.x+-[0-9a-f]{8}-4194304-ab12$/);
 * ```
 *
 * @module
 */
import { createHash } from "node:crypto";

/** The longest node name every backend accepts (a Kubernetes annotation name part). */
export const MAX_NODE_NAME = 63;

/** How many hex digits of the host name's SHA-256 stand for what did not fit. */
const HASH_CHARS = 8;

/**
 * `cli-<host>-<pid>-<random>` within {@linkcode MAX_NODE_NAME} characters: characters a name part
 * cannot hold become `-`; a host that does not fit is cut and followed by a hash of all of it.
 */
export function defaultNodeName(host: string, pid: number, random: string): string {
  const safe = host.replace(/[^A-Za-z0-9._-]/g, "-") || "localhost";
  const tail = `-${pid}-${random}`;
  const whole = `cli-${safe}${tail}`;
  if (whole.length <= MAX_NODE_NAME) return whole;
  const hash = createHash("sha256").update(host, "utf8").digest("hex").slice(0, HASH_CHARS);
  const room = MAX_NODE_NAME - "cli-".length - tail.length - HASH_CHARS - 1;
  // A cut may end in `.` or `-`: harmless inside the name, which ends with the random part.
  return `cli-${safe.slice(0, Math.max(0, room))}-${hash}${tail}`;
}
