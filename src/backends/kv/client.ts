/**
 * Store access shared by the session's parts: every round trip checks the caller's signal first,
 * is counted (tests and the benchmark read the counters), respects the store's batch limits and
 * turns store failures into {@linkcode StoreUnavailableError}.
 *
 * @module
 */
import { abortable, sleep } from "../../abort.ts";
import {
  CorruptEntryError,
  errorMessage,
  IdallocError,
  StoreUnavailableError,
} from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import type { KvContext } from "./context.ts";
import { BUSY_MAX_DELAY_MS, BUSY_MAX_WAIT_MS, MAX_GET_MANY, MAX_LIST_BATCH } from "./limits.ts";
import { formatKey, isKvU64 } from "./schema.ts";
import type { StoreTelemetry } from "../../telemetry/store.ts";

const log = idallocLogger("kv");

/** Round trips made, per kind. */
export interface KvStats {
  /** `get` / `getMany` calls (one per ≤ 10 keys). */
  reads: number;
  /** `list` calls (each may fetch several pages). */
  lists: number;
  /** Atomic commits, successful or not. */
  commits: number;
  /** Where every round trip is also reported (metrics, and child spans inside a traced call). */
  readonly telemetry?: StoreTelemetry;
  /** A counter charged with every round trip too: the session's, when this one is one call's. */
  readonly parent?: KvStats;
}

/** A fresh zeroed counter, reporting to `telemetry`, charging `parent` too. */
export function newStats(telemetry?: StoreTelemetry, parent?: KvStats): KvStats {
  return { reads: 0, lists: 0, commits: 0, telemetry: telemetry ?? parent?.telemetry, parent };
}

type Kind = "reads" | "lists" | "commits";

function charge(stats: KvStats, kind: Kind): void {
  for (let s: KvStats | undefined = stats; s; s = s.parent) s[kind]++;
}

/**
 * Counts a round trip that the session's counters were already charged with (a group commit
 * charges its own): only a call's own counter (one with a `parent`) counts it here.
 */
export function chargeShared(stats: KvStats, kind: Kind): void {
  if (stats.parent) stats[kind]++;
}

/** One round trip (through `guard`), reported to `stats.telemetry` if it has one. */
function roundTrip<T>(
  stats: KvStats,
  what: string,
  signal: AbortSignal,
  fn: () => Promise<T>,
): Promise<T> {
  const run = () => guard(stats, what, signal, fn);
  return stats.telemetry ? stats.telemetry.round(what, signal, run) : run();
}

/** Reads `keys` in snapshot reads of at most 10 keys each. */
export async function getMany(
  ctx: KvContext,
  stats: KvStats,
  keys: readonly Deno.KvKey[],
  signal: AbortSignal,
): Promise<Deno.KvEntryMaybe<unknown>[]> {
  const out: Deno.KvEntryMaybe<unknown>[] = [];
  for (let i = 0; i < keys.length; i += MAX_GET_MANY) {
    signal.throwIfAborted();
    charge(stats, "reads");
    const chunk = keys.slice(i, i + MAX_GET_MANY);
    out.push(...await roundTrip(stats, "read", signal, () => ctx.kv.getMany<unknown[]>(chunk)));
  }
  return out;
}

/** Reads one key. */
export async function get(
  ctx: KvContext,
  stats: KvStats,
  key: Deno.KvKey,
  signal: AbortSignal,
): Promise<Deno.KvEntryMaybe<unknown>> {
  signal.throwIfAborted();
  charge(stats, "reads");
  return await roundTrip(stats, "read", signal, () => ctx.kv.get(key));
}

/**
 * Lists `selector` in pages of `batchSize` (≤ 1000), newest key first when `reverse`, checking
 * `signal` between entries.
 */
export async function* list(
  ctx: KvContext,
  stats: KvStats,
  selector: Deno.KvListSelector,
  signal: AbortSignal,
  batchSize = MAX_LIST_BATCH,
  reverse = false,
): AsyncGenerator<Deno.KvEntry<unknown>> {
  signal.throwIfAborted();
  charge(stats, "lists");
  const options = { batchSize: Math.min(batchSize, MAX_LIST_BATCH), reverse };
  let iter = ctx.kv.list<unknown>(selector, options);
  let cursor: string | undefined;
  // One operation per list; its time is the time spent waiting on the store, not on the consumer.
  const trip = stats.telemetry?.begin("list");
  let waited = 0;
  let failure: unknown;
  try {
    while (true) {
      const asked = performance.now();
      const next = await guard(stats, "list", signal, () => iter.next(), () => {
        // A failed iterator is not reused: resume after the last entry handed out.
        iter = ctx.kv.list<unknown>(
          selector,
          cursor === undefined ? options : { ...options, cursor },
        );
      });
      waited += performance.now() - asked;
      if (next.done) return;
      cursor = iter.cursor;
      yield next.value;
      signal.throwIfAborted();
    }
  } catch (err) {
    failure = err;
    throw err;
  } finally {
    const outcome = failure === undefined ? "ok" : signal.aborted ? "cancelled" : "error";
    trip?.end(outcome, failure, waited / 1000);
  }
}

/** Commits `op`: `{ ok: false }` when a check failed; throws when the store failed. */
export async function commit(
  stats: KvStats,
  op: Deno.AtomicOperation,
  signal: AbortSignal,
): Promise<Deno.KvCommitResult | Deno.KvCommitError> {
  signal.throwIfAborted();
  charge(stats, "commits");
  return await roundTrip(stats, "commit", signal, () => op.commit());
}

/** One change of a master, for the change feed. */
export interface LogChange {
  readonly id: number;
  /** The key, or `null` when the master is deleted. */
  readonly key: string | null;
}

/**
 * A new atomic operation for a commit that changes masters: its first mutation adds the number of
 * change-feed entries for `changes` to `gen` (so a watcher can tell from `gen` whether it saw every
 * entry), then come the entries. Commit it with {@linkcode commitLogged}.
 *
 * Deno KV applies the mutations of a commit in order and, when one fails, throws but keeps the
 * earlier ones (`docs/deno-kv-partial-commit.md`). The only mutation of idalloc's that can fail on
 * what the store holds is this `sum` (on a `gen` that is not a `Deno.KvU64`); as the first one, it
 * fails before anything else is applied. Every other write is a `set` or `delete`, which no stored
 * value can make fail.
 */
export function loggedAtomic(ctx: KvContext, changes: readonly LogChange[]): Deno.AtomicOperation {
  const op = ctx.kv.atomic();
  if (changes.length === 0) return op;
  op.sum(ctx.layout.gen(), BigInt(changes.length));
  const ms = ctx.settings.now();
  for (const change of changes) {
    op.set(ctx.layout.log(ms, ctx.settings.node, nonce()), { id: change.id, key: change.key }, {
      expireIn: ctx.settings.logRetentionMs,
    });
  }
  return op;
}

/**
 * Commits an operation made by {@linkcode loggedAtomic}. If the store refused it because `gen`
 * holds a value of the wrong type (nothing was applied: the `sum` comes first), `gen` is reset,
 * guarded by the versionstamp of the bad value, and the same operation is committed once more.
 * A second refusal throws {@linkcode CorruptEntryError}.
 */
export async function commitLogged(
  ctx: KvContext,
  stats: KvStats,
  op: Deno.AtomicOperation,
  signal: AbortSignal,
): Promise<Deno.KvCommitResult | Deno.KvCommitError> {
  try {
    return await commit(stats, op, signal);
  } catch (err) {
    if (!isCounterTypeError(err)) throw err;
    await repairCounter(ctx, stats, ctx.layout.gen(), signal);
    // Every check of `op` is evaluated again, so a retry is exactly as guarded as the first try.
    return await commit(stats, op, signal);
  }
}

/**
 * Resets `key` to `Deno.KvU64(0)` if it holds anything else, guarded by the versionstamp of what
 * was read: a concurrent repair, or a valid write, wins. Returns whether it reset it.
 *
 * Zero is safe for `gen`: a watcher whose last count is higher sees the counter go back and
 * re-lists, and one that read the bad value re-lists on any change of it (see `watch.ts`).
 */
async function repairCounter(
  ctx: KvContext,
  stats: KvStats,
  key: Deno.KvKey,
  signal: AbortSignal,
): Promise<boolean> {
  const entry = await get(ctx, stats, key, signal);
  if (entry.versionstamp === null || isKvU64(entry.value)) return false;
  log.warning("counter {key} holds a value of the wrong type; resetting it to 0", {
    key: formatKey(key),
  });
  const op = ctx.kv.atomic().check(entry).set(key, new ctx.KvU64(0n));
  return (await commit(stats, op, signal)).ok;
}

/** Whether `err` is the store refusing a `sum`/`min`/`max` on a value that is not a counter. */
function isCounterTypeError(err: unknown): boolean {
  return err instanceof CorruptEntryError && COUNTER_TYPE.test(errorMessage(err.cause));
}

/** Deno KV's message for a `sum`/`min`/`max` on a stored value that is not a `Deno.KvU64`. */
const COUNTER_TYPE = /mutation on a non-U64 value/i;
/** Deno KV's messages for a key or value over its limits: a bug of the caller, never transient. */
const OVER_LIMIT = /too large|too many (checks|mutations)/i;

/** A random id, for lease ids and log-entry nonces. */
export function nonce(): string {
  return crypto.randomUUID();
}

async function guard<T>(
  stats: KvStats,
  what: string,
  signal: AbortSignal,
  fn: () => Promise<T>,
  beforeRetry?: () => void,
): Promise<T> {
  let busySince: number | undefined;
  for (let attempt = 0;; attempt++) {
    try {
      // Raced against the caller's signal: a call can wait on SQLite's write lock for as long as
      // another process holds it (one stopped mid-commit holds it until it resumes). A commit
      // that lands after the abort is the caller's to clean up, as with any aborted write.
      return await abortable(fn(), signal);
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      if (err instanceof IdallocError) throw err;
      // SQLite refuses a transaction while another handle or process writes the same file. The
      // transaction was not applied, so retrying is safe (and a retried guarded commit that did
      // apply would just fail its checks and take the re-read path).
      if (isBusy(err) && Date.now() - (busySince ??= Date.now()) < BUSY_MAX_WAIT_MS) {
        stats.telemetry?.retry(what, err);
        await sleep(Math.random() * Math.min(BUSY_MAX_DELAY_MS, 2 ** attempt), signal);
        beforeRetry?.();
        continue;
      }
      // What the store holds, or what was asked of it, is wrong: retrying cannot help, and the
      // store is not unavailable.
      if (COUNTER_TYPE.test(errorMessage(err))) {
        throw new CorruptEntryError(
          `Deno KV ${what} refused: a counter holds a value of the wrong type`,
          { cause: err },
        );
      }
      if (OVER_LIMIT.test(errorMessage(err))) {
        throw new IdallocError(`Deno KV ${what} refused: ${errorMessage(err)}`, { cause: err });
      }
      throw new StoreUnavailableError(`Deno KV ${what} failed: ${errorMessage(err)}`, {
        cause: err,
      });
    }
  }
}

function isBusy(err: unknown): boolean {
  return /database is (locked|busy)/i.test(errorMessage(err));
}
