/**
 * The allocator's parts, built in dependency order: each part receives only parts built before
 * it, so none is reached before it exists. Leaves first (the ID space, pool, cache, local holds,
 * key locks and fence), then the cache feed, the reference deletions, the acquirer (it records
 * into the feed and hands aborted writes to the deletions), the re-check (it uses all of these)
 * and GC. The one report that runs the other way, the feed telling the re-check about held keys,
 * is wired when the feed's watch starts ({@linkcode startParts}), after both exist.
 *
 * {@linkcode startParts} starts the background work; {@linkcode closeParts} lets reference
 * deletions land, then stops it and closes the session.
 *
 * @module
 */
import { sleep } from "../abort.ts";
import { Acquirer } from "./acquire.ts";
import type { Backend, BackendSession } from "./backend.ts";
import { IdCache } from "./cache.ts";
import { CacheFeed } from "./cache_feed.ts";
import { ReferenceDeletions } from "./deletions.ts";
import { Fence } from "./fence.ts";
import { GarbageCollector, RateLimiter } from "./gc.ts";
import { IdPool } from "./id_pool.ts";
import { IdSpace } from "./id_space.ts";
import { KeyedMutex } from "./keyed_mutex.ts";
import { LocalKeys } from "./local_keys.ts";
import type { AllocatorSettings } from "./options.ts";
import { Recheck } from "./recheck.ts";
import { ClosedError } from "../errors.ts";
import { idallocLogger } from "../log.ts";
import { TaskGroup } from "../task_group.ts";
import { AllocatorTelemetry, identityOf } from "../telemetry/allocator.ts";

const log = idallocLogger("allocator");

/** Every part of one allocator (see the module doc). */
export interface AllocatorParts<K> {
  /** The backend session (the node's lease) every part talks to the store through. */
  readonly session: BackendSession;
  /** The closing signal and the background tasks that stop with it. */
  readonly tasks: TaskGroup;
  /** Metrics and spans (see `src/telemetry/`). */
  readonly telemetry: AllocatorTelemetry;
  readonly space: IdSpace;
  readonly pool: IdPool;
  readonly cache: IdCache<K>;
  /** Keys this node holds, with their local reference counts. */
  readonly local: LocalKeys;
  /** One writer per key. */
  readonly mutex: KeyedMutex;
  /** Held keys this node may not answer from memory until the store is re-checked. */
  readonly fence: Fence;
  readonly feed: CacheFeed<K>;
  /** Every deletion of this node's references: queued, in flight, failed. */
  readonly deletions: ReferenceDeletions;
  readonly acquirer: Acquirer<K>;
  readonly recheck: Recheck<K>;
  readonly gc: GarbageCollector;
}

/** Builds the parts of an allocator on `session`, in dependency order (see the module doc). */
export function buildParts<K>(
  backend: Pick<Backend, "kind" | "node" | "admin">,
  session: BackendSession,
  settings: AllocatorSettings<K>,
): AllocatorParts<K> {
  const tasks = new TaskGroup("allocator");
  const telemetry = new AllocatorTelemetry(identityOf(backend));
  const space = new IdSpace(settings.min, settings.max, settings.prefixMask);
  const pool = new IdPool(settings.min, settings.max);
  // Own allocations enter the cache decoded (see `IdCache.insertLocal`).
  const cache = new IdCache<K>((k) => settings.codec.decode(k));
  const local = new LocalKeys();
  const mutex = new KeyedMutex();
  const fence = new Fence();
  const { codec, validator, backoff } = settings;
  const feed = new CacheFeed<K>({
    session,
    cache,
    pool,
    space,
    local,
    codec,
    validator,
    backoff,
    telemetry,
  });
  const deletions = new ReferenceDeletions({ session, local, signal: tasks.signal });
  const acquirer = new Acquirer<K>({
    session,
    cache,
    pool,
    space,
    policy: settings,
    record: (key, id, version) => feed.insertLocal(key, id, version),
    deletions,
    onRetry: (err) => telemetry.retry(err),
  });
  const recheck = new Recheck<K>({
    session,
    fence,
    local,
    mutex,
    cache,
    feed,
    acquirer,
    deletions,
    codec,
    tasks,
    telemetry,
    node: backend.node,
    backoff,
    masterKeyProtection: settings.masterKeyProtection,
    readOnly: settings.readOnly,
  });
  const gc = new GarbageCollector(
    session,
    space.stored,
    new RateLimiter(settings.gcRateLimit.intervalMs, settings.gcRateLimit.burst),
    settings.gcGraceMs,
  );
  return {
    session,
    tasks,
    telemetry,
    space,
    pool,
    cache,
    local,
    mutex,
    fence,
    feed,
    deletions,
    acquirer,
    recheck,
    gc,
  };
}

/**
 * Starts the background work: the feed's watch (reporting held keys to the re-check) and, on a
 * writable allocator, the claim timer, the periodic sync and, with `gcIntervalMs`, periodic GC
 * passes through `runGc` (the allocator's own, so a closed allocator runs none).
 */
export function startParts<K>(
  p: AllocatorParts<K>,
  settings: AllocatorSettings<K>,
  runGc: (signal: AbortSignal) => Promise<unknown>,
): void {
  const signal = p.tasks.signal;
  const spawn = (task: Promise<unknown>) =>
    p.tasks.spawn(task, (err) => log.error("background task failed: {err}", { err }));
  spawn(p.feed.run(signal, p.recheck));
  if (settings.readOnly) return;
  p.recheck.start();
  spawn(every(p, settings.syncIntervalMs, () => p.recheck.requestSync()));
  const gcMs = settings.gcIntervalMs;
  if (gcMs !== undefined) spawn(every(p, gcMs, () => runGc(signal)));
}

/** Runs `fn` every `ms` once the initial list is in, until the allocator closes. */
async function every<K>(p: AllocatorParts<K>, ms: number, fn: () => unknown): Promise<void> {
  const signal = p.tasks.signal;
  await p.feed.waitForInitialSync(signal);
  while (!signal.aborted) {
    await sleep(ms, signal);
    try {
      await fn();
    } catch (err) {
      if (!signal.aborted) log.warning("periodic task failed: {err}", { err });
    }
  }
}

/**
 * Lets reference deletions land (at most `ReferenceDeletions.close`'s bound), then stops every
 * background task, ends the feed's waits and streams, and closes the session.
 */
export async function closeParts<K>(p: AllocatorParts<K>): Promise<void> {
  await p.deletions.close();
  await p.tasks.close(() => {
    p.telemetry.close();
    p.recheck.stop();
    p.feed.close(new ClosedError("allocator"));
  }, () => p.session.close());
}
