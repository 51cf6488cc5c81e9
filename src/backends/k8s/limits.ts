/**
 * Limits of the Kubernetes API that shape the backend, and the backend's own bounds, in one place.
 *
 * @module
 */

/**
 * Total size of an object's annotations the API server accepts (`TotalAnnotationSizeLimitB`,
 * keys and values): 256 KiB.
 */
export const ANNOTATIONS_MAX_BYTES = 256 * 1024;

/**
 * The largest key (UTF-8 bytes): the claim Lease carries it as an annotation beside a few short
 * ones, so it must fit the annotation limit with room to spare. (The identity itself carries the
 * key in `security-labels`, where the object limit of about 1.5 MiB is far away.)
 */
export const MAX_KEY_BYTES: number = ANNOTATIONS_MAX_BYTES - 4 * 1024;

/**
 * The fewest references one node's reference object (`refs.ts`) holds, whatever its IDs: each
 * costs `<id>=<epoch>,` in its packed list (at most 16 digits, a safe integer, and a 16-character
 * epoch) of the 256 KiB of annotations, 4 KiB kept for the rest. With Cilium's identity range (IDs
 * of at most 5 digits) about 11,200 fit (`refsBytes` is the exact measure the node checks). A node
 * holds one per distinct label set of its endpoints: about 110 pods per node by default, so far
 * below. There is no bound on the nodes per identity: references do not grow the identity.
 */
export const MAX_REFS_PER_NODE: number = Math.floor(
  (ANNOTATIONS_MAX_BYTES - 4 * 1024 - "idalloc.io/held".length) / (16 + 1 + 16 + 1),
);

/** The annotation bytes a reference object's packed references take (the API server's measure). */
export function refsBytes(refs: Iterable<readonly [number, string]>): number {
  let bytes = "idalloc.io/held".length - 1;
  for (const [id, epoch] of refs) bytes += String(id).length + 1 + epoch.length + 1;
  return bytes;
}

/** The most annotation bytes a node's references may take (the rest of the limit is spare). */
export const REFS_MAX_BYTES: number = ANNOTATIONS_MAX_BYTES - 4 * 1024;

/** Objects per list page (watch's initial list, GC, admin, doctor). */
export const LIST_PAGE = 500;

/** Writes one `acquire` may make before it gives up with a `ConflictError`. */
export const MAX_ACQUIRE_ROUNDS = 8;

/** How often one `acquire` re-writes its reference after the lease was replaced meanwhile. */
export const MAX_LEASE_CHASES = 3;

/** Held keys `ensure` reads (one GET each, only those the informer shows wrong) at a time. */
export const ENSURE_CONCURRENCY = 8;

/** Rounds per held key when a write of `ensure` met a changed object. */
export const MAX_ENSURE_ROUNDS = 3;

/**
 * Backoff bounds between watch (re)starts after failures, in ms: the ceiling doubles from this
 * after each failure in a row, and each wait is drawn below it (full jitter).
 */
export const WATCH_RETRY_MIN_MS = 100;
/** The ceiling's cap (client-go's reflector backs off to 30 s). */
export const WATCH_RETRY_MAX_MS = 30_000;

/** The shortest server-side timeout of one watch, in seconds (client-go's reflector's: 5 min). */
export const WATCH_TIMEOUT_SECONDS = 300;

/**
 * How long a watch may stay silent before it counts as dead, in ms: the API server sends a
 * bookmark about every minute when nothing changes.
 */
export const WATCH_IDLE_MS = 120_000;

/** Cilium operator's default `--identity-heartbeat-timeout`: 30 minutes. */
export const CILIUM_HEARTBEAT_TIMEOUT_MS = 30 * 60_000;

/** Length of a lease epoch (random hex). */
export const EPOCH_CHARS = 16;

/** UTF-8 length of `s`. */
export function utf8Length(s: string): number {
  return new TextEncoder().encode(s).length;
}
