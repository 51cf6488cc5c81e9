/**
 * Deno KV limits and the backend's own batch sizes, in one place. The store enforces the limits
 * (`ext/kv/config.rs`); Deno Deploy may differ, so nothing else hard-codes these numbers.
 *
 * @module
 */

/** Largest encoded key a write accepts, in bytes. */
export const MAX_KEY_BYTES = 2048;
/** Largest V8-serialized value, in bytes. */
export const MAX_VALUE_BYTES = 65536;
/** Keys per `getMany` (one snapshot read). */
export const MAX_GET_MANY = 10;
/** Entries one `list` round trip may return. */
export const MAX_LIST_BATCH = 1000;
/** Checks per atomic operation (Deno's own KV). */
export const MAX_CHECKS = 100;
/**
 * Checks per atomic operation of a store opened by the `@deno/kv` npm package (0.14, Node.js):
 * its native store still has the old limit (measured: 10 pass, 11 fail with `TooManyChecks`).
 */
export const NPM_KV_MAX_CHECKS = 10;
/** Mutations per atomic operation. */
export const MAX_MUTATIONS = 1000;
/** Total encoded size of the keys one atomic operation writes. */
export const MAX_TOTAL_KEY_BYTES = 81920;
/** What a batched commit of this backend allows itself of `MAX_TOTAL_KEY_BYTES` (a margin). */
export const COMMIT_KEY_BUDGET = 65536;

/** Page size of master listings (watch, resync, GC). */
export const LIST_BATCH = 500;
/** Commit rounds of one `acquire` before it gives up with a `ConflictError`. */
export const MAX_ACQUIRE_ROUNDS = 5;
/** How often one `acquire` follows a lease replaced while its commit was in flight. */
export const MAX_LEASE_CHASES = 3;
/** Held keys per `ensure` commit: at most 2 checks and 7 mutations each. */
export const ENSURE_BATCH = 40;
/** Commit rounds per held key when a batched `ensure` commit lost a race. */
export const MAX_ENSURE_ROUNDS = 3;
/**
 * Checks a GC delete needs besides the dead references: master, key index, touch counter. Each
 * dead reference adds two (the reference and its node's lease record).
 */
export const GC_FIXED_CHECKS = 3;
/** Overhead allowed for the V8 serialization of a master value `{ key }`, in bytes. */
export const MASTER_VALUE_OVERHEAD = 64;

/**
 * How long a round trip that SQLite refuses as busy ("database is locked") is retried before it
 * fails as unavailable, in ms. Time, not a count: the writer holding the lock may be another
 * process the machine has not scheduled for seconds (100 retries, about 2.5 s, failed opens and
 * commits of 3 processes on one file at load 40).
 */
export const BUSY_MAX_WAIT_MS = 30_000;
/** Upper bound of the jittered wait between busy retries, in ms. */
export const BUSY_MAX_DELAY_MS = 50;
/**
 * Least time between two change-feed polls. An in-process `kv.watch` fires on every commit; on a
 * local file reads and writes share one SQLite thread, so polling per commit would cost two reads
 * per allocation. Waiting a little batches a burst of changes into one poll.
 */
export const MIN_POLL_GAP_MS = 25;
