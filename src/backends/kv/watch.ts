/**
 * The change feed behind `watch`: an initial list of every master, then changes read from the
 * time-keyed log, so the cost of following the store is proportional to the changes.
 *
 * `kv.watch` takes at most 10 keys, coalesces updates and does not fire for writes of another
 * process on a local file. So the feed wakes on two sources: `kv.watch([gen])` (in-process writes,
 * Deno Deploy) and a poll of `gen` every `pollIntervalMs`. When `gen`'s versionstamp moved, it
 * lists the log from shortly before the previous poll and applies the entries whose versionstamp
 * lies in `(previous gen versionstamp, current gen versionstamp]`, in versionstamp order. Every
 * entry committed before the `gen` read is visible to the list after it, and versionstamps order
 * commits, so this applies every change exactly once and in order.
 *
 * `gen` counts log entries, so the feed knows how many entries the range must hold. Fewer means
 * some were missed (a writer whose clock is off by more than `maxClockSkewMs`, a commit delayed
 * beyond the window, entries expired while the consumer stalled): the feed then re-lists every
 * master and reports the difference. It also re-lists every `resyncIntervalMs` as a safety net.
 *
 * `gen` is never trusted blindly: a value that is not a `Deno.KvU64` (garbage written over it)
 * counts nothing, so any change of `gen` from or to such a value re-lists too. Writers reset a
 * bad `gen` before their next logged commit (`client.ts`).
 *
 * @module
 */
import type { BackendEvent } from "../../allocator/backend.ts";
import { idallocLogger } from "../../log.ts";
import { get, type KvStats, list } from "./client.ts";
import type { KvContext } from "./context.ts";
import { LIST_BATCH, MIN_POLL_GAP_MS } from "./limits.ts";
import { sleep } from "../../abort.ts";
import { corrupt, counterValue, decode } from "./schema.ts";

const log = idallocLogger("kv", "watch");

/** What the feed reports to its session. */
export interface WatchHooks {
  /** A round trip failed (the feed retries at the next poll). */
  onError(err: unknown): void;
  /** A round trip succeeded. */
  onSuccess(): void;
  /** Keeps track of the feed's background task, so that closing the session can await it. */
  track(task: Promise<void>): void;
}

interface Known {
  readonly key: string;
  readonly version: string;
}

/** Where the feed stands in the log. */
interface Cursor {
  /** `gen`'s versionstamp at the last read (`""`: absent). */
  readonly vs: string;
  /** `gen`'s value then (0 when absent or not a counter). */
  readonly count: bigint;
  /** Whether `gen` was absent or a counter (`false`: garbage; its count means nothing). */
  readonly valid: boolean;
  /** Own clock when `gen` was read. */
  readonly time: number;
}

type Change = Exclude<BackendEvent, { type: "synced" }>;

/** Every master as `upsert`, `synced`, then changes; ends when `signal` aborts. */
export async function* watchMasters(
  ctx: KvContext,
  stats: KvStats,
  signal: AbortSignal,
  hooks: WatchHooks,
): AsyncGenerator<BackendEvent> {
  const { settings } = ctx;
  const known = new Map<number, Known>();
  const waker = new GenWaker(ctx.wakeByWatch ? ctx.kv : undefined, ctx.layout.gen(), signal);
  hooks.track(waker.done);
  try {
    let cursor: Cursor | undefined;
    let events: Change[] = [];
    while (cursor === undefined) {
      try {
        stats.telemetry?.relist("initial");
        ({ cursor, events } = await relist(ctx, stats, known, signal));
        hooks.onSuccess();
      } catch (err) {
        if (signal.aborted) return;
        hooks.onError(err);
        await waker.wait(settings.pollIntervalMs);
        if (signal.aborted) return;
      }
    }
    let lastList = settings.now();
    yield* events;
    yield { type: "synced" };
    let lastPoll = 0;
    while (true) {
      await waker.wait(settings.pollIntervalMs);
      const gap = lastPoll + Math.min(MIN_POLL_GAP_MS, settings.pollIntervalMs) - Date.now();
      if (gap > 0) await sleep(gap, signal).catch(() => {});
      if (signal.aborted) return;
      lastPoll = Date.now();
      try {
        let next: { cursor: Cursor; events: Change[] } | RelistReason = "resync";
        if (settings.now() - lastList < settings.resyncIntervalMs) {
          next = await poll(ctx, stats, known, cursor, signal);
        }
        if (typeof next === "string") {
          stats.telemetry?.relist(next);
          next = await relist(ctx, stats, known, signal);
          lastList = settings.now();
        }
        ({ cursor, events } = next);
        hooks.onSuccess();
      } catch (err) {
        if (signal.aborted) return;
        hooks.onError(err);
        continue;
      }
      yield* events;
    }
  } finally {
    await waker.close();
  }
}

/** Lists every master and returns the difference to `known` (which it updates). */
async function relist(
  ctx: KvContext,
  stats: KvStats,
  known: Map<number, Known>,
  signal: AbortSignal,
): Promise<{ cursor: Cursor; events: Change[] }> {
  const { layout, settings } = ctx;
  const time = settings.now();
  // Read before the list: every change up to this versionstamp is reflected in the list.
  const gen = await get(ctx, stats, layout.gen(), signal);
  const fresh = new Map<number, Known>();
  for await (const entry of list(ctx, stats, { prefix: layout.ids() }, signal, LIST_BATCH)) {
    const id = layout.parseId(entry.key);
    if (id === undefined) {
      corrupt(entry.key, "not a master key");
      continue;
    }
    const value = decode.master(entry);
    if (value !== undefined) fresh.set(id, { key: value.key, version: entry.versionstamp });
  }
  const events: Change[] = [];
  for (const [id, now] of fresh) {
    const before = known.get(id);
    if (before?.key !== now.key || before.version !== now.version) {
      events.push({ type: "upsert", id, key: now.key, version: now.version });
    }
  }
  for (const id of known.keys()) if (!fresh.has(id)) events.push({ type: "delete", id });
  known.clear();
  for (const [id, k] of fresh) known.set(id, k);
  return { cursor: cursorOf(gen, time), events };
}

/** Why the feed lists every master again (the telemetry's `idalloc.reason`). */
type RelistReason = "resync" | "missed" | "counter";

/**
 * Applies the log entries written since `cursor`, or returns why the caller must re-list instead
 * (entries are missing, or the change counter cannot be trusted).
 */
async function poll(
  ctx: KvContext,
  stats: KvStats,
  known: Map<number, Known>,
  cursor: Cursor,
  signal: AbortSignal,
): Promise<{ cursor: Cursor; events: Change[] } | RelistReason> {
  const { layout, settings } = ctx;
  const time = settings.now();
  const gen = await get(ctx, stats, layout.gen(), signal);
  const next = cursorOf(gen, time);
  if (next.vs === cursor.vs) return { cursor: next, events: [] };
  if (!next.valid || !cursor.valid) {
    log.warning("change counter holds a value of the wrong type; re-listing");
    return "counter";
  }
  if (next.count < cursor.count) {
    log.info("change counter went back; re-listing");
    return "counter";
  }
  // Writers stamp entries with their own clock before committing: allow for skew and for a
  // commit in flight across the previous poll.
  const from = cursor.time - settings.maxClockSkewMs - settings.pollIntervalMs;
  const wanted = next.count - cursor.count;
  const entries: { id: number; key: string | null; vs: string; at: number | undefined }[] = [];
  const selector = { prefix: layout.logs(), start: [...layout.logs(), from] };
  // Newest first: the new entries sit at the tail of the time-keyed log, so the walk stops after
  // about `wanted` entries instead of reading the whole skew window (which made a burst of
  // allocations cost quadratic feed reads).
  const batch = Math.min(Number(wanted) + 16, LIST_BATCH);
  const timePart = layout.logs().length;
  for await (const entry of list(ctx, stats, selector, signal, batch, true)) {
    if (entry.versionstamp <= cursor.vs || entry.versionstamp > next.vs) continue;
    if (!layout.isLog(entry.key)) {
      corrupt(entry.key, "not a change-feed key");
      continue;
    }
    const value = decode.log(entry);
    // The writer's clock stamp (the key's time part) dates the change for the watch-lag metric.
    const ms = entry.key[timePart];
    const at = typeof ms === "number" ? ms : undefined;
    if (value !== undefined) entries.push({ ...value, vs: entry.versionstamp, at });
    if (BigInt(entries.length) === wanted) break;
  }
  if (BigInt(entries.length) !== wanted) {
    log.info("change feed missed {missing} entries; re-listing", {
      missing: Number(next.count - cursor.count) - entries.length,
    });
    return "missed";
  }
  entries.sort((a, b) => a.vs < b.vs ? -1 : a.vs > b.vs ? 1 : 0);
  const events: Change[] = [];
  for (const { id, key, vs, at } of entries) {
    const before = known.get(id);
    // A change no newer than what is known (the list already showed it) is skipped, so an old
    // create is never applied after a newer delete.
    if (before !== undefined && before.version >= vs) continue;
    if (key === null) {
      if (before === undefined) continue;
      known.delete(id);
      events.push({ type: "delete", id, at });
    } else {
      known.set(id, { key, version: vs });
      events.push({ type: "upsert", id, key, version: vs, at });
    }
  }
  return { cursor: next, events };
}

function cursorOf(gen: Deno.KvEntryMaybe<unknown>, time: number): Cursor {
  const count = counterValue(gen);
  return {
    vs: gen.versionstamp ?? "",
    count: count ?? 0n,
    valid: gen.versionstamp === null || count !== undefined,
    time,
  };
}

/**
 * Wakes the feed when `gen` changes in this process (or on Deploy) through `kv.watch`, or after a
 * timeout. The watch stream is cancelled as soon as `signal` aborts, even while the generator is
 * suspended at a `yield`, so nothing stays open. Without a `kv` (see `KvContext.wakeByWatch`) it
 * only times out: the feed polls.
 */
class GenWaker {
  readonly done: Promise<void>;
  readonly #signal: AbortSignal;
  #reader: ReadableStreamDefaultReader<Deno.KvEntryMaybe<unknown>[]> | undefined;
  #dirty = false;
  #wake: (() => void) | undefined;
  #consumed = Promise.withResolvers<void>();
  #closed = false;

  constructor(kv: Deno.Kv | undefined, key: Deno.KvKey, signal: AbortSignal) {
    this.#signal = signal;
    const onAbort = () => {
      this.#reader?.cancel().catch(() => {});
      this.#wake?.();
      this.#consumed.resolve();
    };
    signal.addEventListener("abort", onAbort, { once: true });
    this.done = this.#pump(kv, key).finally(() => signal.removeEventListener("abort", onAbort));
  }

  async #pump(kv: Deno.Kv | undefined, key: Deno.KvKey): Promise<void> {
    if (this.#signal.aborted || kv === undefined) return;
    try {
      this.#reader = kv.watch([key]).getReader();
      while (!this.#signal.aborted && !this.#closed) {
        const { done } = await this.#reader.read();
        if (done) return;
        this.#dirty = true;
        this.#wake?.();
        // Pull the next notification only after the feed has polled: the stream re-reads `gen`
        // for every notification it delivers, and on a local file that read shares the SQLite
        // thread with commits. Not pulling lets a burst of commits coalesce into one read.
        await this.#consumed.promise;
      }
    } catch (err) {
      // Without the in-process wake-up the poll still finds every change.
      if (!this.#signal.aborted) log.debug("kv.watch ended: {err}", { err });
    }
  }

  /** Resolves after `ms`, on a change, or on abort, whichever comes first. */
  wait(ms: number): Promise<void> {
    const consumed = this.#consumed;
    this.#consumed = Promise.withResolvers<void>();
    consumed.resolve();
    if (this.#dirty || this.#signal.aborted) {
      this.#dirty = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.#wake = undefined;
        this.#dirty = false;
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.#wake = done;
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
    // The pump may be parked until the next poll (a consumer that broke out of the feed never
    // polls again): release it, or closing would wait forever.
    this.#consumed.resolve();
    await this.#reader?.cancel().catch(() => {});
    await this.done;
  }
}
