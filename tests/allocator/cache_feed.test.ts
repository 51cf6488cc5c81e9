// The cache feed against the session test double: the list and live events reach the cache, the
// pool and subscribers; a late subscriber gets a replay; a re-list drops vanished IDs; held keys
// are reported to the owner, not decided here.
import assert from "node:assert/strict";
import { IdCache } from "../../src/allocator/cache.ts";
import { CacheFeed, type FeedHooks } from "../../src/allocator/cache_feed.ts";
import { IdPool } from "../../src/allocator/id_pool.ts";
import { IdSpace } from "../../src/allocator/id_space.ts";
import { LocalKeys } from "../../src/allocator/local_keys.ts";
import type { AllocatorEvent } from "../../src/allocator/types.ts";
import { AllocatorTelemetry } from "../../src/telemetry/allocator.ts";
import { eventually } from "../_support/eventually.ts";
import { SessionDouble } from "./_session_double.ts";

function feedOn(session: SessionDouble, hooks: Partial<FeedHooks> = {}) {
  const cache = new IdCache<string>((k) => k);
  const pool = new IdPool(1, 100);
  const local = new LocalKeys();
  const told: string[] = [];
  const feed = new CacheFeed<string>({
    session,
    cache,
    pool,
    space: new IdSpace(1, 100, 0),
    local,
    codec: { encode: (k) => k, decode: (k) => k },
    validator: ({ id }) => (id === 66 ? "66 is reserved" : undefined),
    backoff: { initialMs: 1, maxMs: 5, factor: 1 },
    telemetry: new AllocatorTelemetry({ backend: "session-double", prefix: "p", node: "n" }),
  });
  const stop = new AbortController();
  const running = feed.run(stop.signal, {
    conflict: (key, why) => told.push(`conflict ${key}: ${why}`),
    deletedHeld: (key, id) => {
      told.push(`deleted ${key}/${id}`);
      return hooks.deletedHeld?.(key, id) ?? false;
    },
  });
  return {
    feed,
    cache,
    pool,
    local,
    told,
    [Symbol.asyncDispose]: async () => {
      stop.abort();
      feed.close(new Error("closed"));
      await running;
    },
  };
}

async function take<T>(it: AsyncIterator<T>, n: number): Promise<T[]> {
  const out: T[] = [];
  while (out.length < n) {
    const r = await it.next();
    if (r.done) break;
    out.push(r.value);
  }
  return out;
}

Deno.test("CacheFeed: the list fills cache and pool; a late subscriber gets a replay, then live events", async () => {
  const session = new SessionDouble();
  session.masters.set(5, "a;");
  session.masters.set(66, "reserved;");
  await using f = feedOn(session);
  await f.feed.waitForInitialSync(AbortSignal.timeout(2_000));
  assert.equal(f.feed.synced, true);
  assert.equal(f.cache.entry(5)?.key, "a;");
  assert.equal(f.cache.entry(66), undefined, "the validator's rejection is skipped");
  assert.equal(f.pool.available, 99, "the listed ID left the pool");

  const stop = new AbortController();
  const stream = f.feed.subscribe(stop.signal)[Symbol.asyncIterator]();
  assert.deepEqual(await take(stream, 2), [
    { type: "upsert", id: 5, key: "a;" },
    { type: "synced" },
  ]);
  session.push({ type: "upsert", id: 7, key: "b;", version: "2" });
  session.push({ type: "delete", id: 5 });
  assert.deepEqual(
    await take(stream, 2),
    [
      { type: "upsert", id: 7, key: "b;" },
      { type: "delete", id: 5, key: "a;" },
    ] satisfies AllocatorEvent<string>[],
  );
  assert.equal(f.pool.available, 99, "5 came back, 7 left");
  stop.abort();
  assert.equal((await stream.next()).done, true, "the stream ends with its signal");
});

Deno.test("CacheFeed: a re-list after a broken watch deletes what vanished meanwhile", async () => {
  const session = new SessionDouble();
  session.masters.set(5, "a;");
  session.masters.set(6, "b;");
  await using f = feedOn(session);
  await f.feed.waitForInitialSync(AbortSignal.timeout(2_000));
  session.masters.delete(6);
  session.endWatches();
  await eventually(() => f.cache.entry(6) === undefined, "6 is gone after the re-list");
  assert.equal(f.cache.entry(5)?.key, "a;");
});

Deno.test("CacheFeed: held keys are reported to the owner, who may keep a deleted ID", async () => {
  const session = new SessionDouble();
  session.masters.set(5, "held;");
  let keep = true;
  await using f = feedOn(session, { deletedHeld: () => keep });
  await f.feed.waitForInitialSync(AbortSignal.timeout(2_000));
  f.local.add("held;", 5);
  // Another key takes the held ID; the held key appears under another ID.
  session.push({ type: "upsert", id: 5, key: "other;", version: "2" });
  session.push({ type: "upsert", id: 9, key: "held;", version: "3" });
  await eventually(() => f.told.length === 2, "two conflicts told");
  assert.deepEqual(f.told, [
    "conflict held;: ID 5 now belongs to 'other;'",
    "conflict held;: the store also maps it to ID 9",
  ]);
  // A deleted master of a held ID: kept (protection) means no delete reaches the cache.
  session.push({ type: "delete", id: 5 });
  await eventually(() => f.told.length === 3, "the deletion is told");
  assert.equal(f.cache.entry(5)?.key, "other;");
  keep = false;
  session.push({ type: "delete", id: 5 });
  await eventually(() => f.cache.entry(5) === undefined, "not kept: deleted");
});

Deno.test("CacheFeed: closing fails every wait for the initial list", async () => {
  const session = new SessionDouble();
  // A watch that never lists: the feed never syncs.
  // deno-lint-ignore require-yield -- a watch that yields nothing is the point
  session.watch = async function* (signal: AbortSignal) {
    await new Promise((resolve) => signal.addEventListener("abort", resolve, { once: true }));
  };
  const f = feedOn(session);
  const waiting = f.feed.waitForInitialSync(AbortSignal.timeout(5_000));
  await f[Symbol.asyncDispose]();
  await assert.rejects(waiting, /closed/);
});
