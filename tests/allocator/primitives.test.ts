import assert from "node:assert/strict";
import { backoffDelay } from "../../src/allocator/backoff.ts";
import { sleep } from "../../src/abort.ts";
import { EventQueue } from "../../src/allocator/event_queue.ts";
import { IdCache } from "../../src/allocator/cache.ts";
import { KeyedMutex } from "../../src/allocator/keyed_mutex.ts";
import { resolveOptions } from "../../src/allocator/options.ts";
import { InvalidOptionsError } from "../../src/errors.ts";

Deno.test("backoff: exponential, capped, jittered", () => {
  const b = { initialMs: 20, maxMs: 1000, factor: 2 };
  assert.equal(backoffDelay(b, 0, () => 1), 20);
  assert.equal(backoffDelay(b, 3, () => 1), 160);
  assert.equal(backoffDelay(b, 30, () => 1), 1000);
  assert.equal(backoffDelay(b, 5, () => 0), 0);
});

Deno.test("sleep: rejects with the signal's reason and leaves no timer", async () => {
  const controller = new AbortController();
  const pending = sleep(60_000, controller.signal);
  controller.abort(new Error("stop"));
  await assert.rejects(pending, { message: "stop" });
  await assert.rejects(sleep(1, AbortSignal.abort(new Error("early"))), { message: "early" });
});

Deno.test("KeyedMutex: serialises one key, not others; abort while waiting", async () => {
  const mutex = new KeyedMutex();
  const order: string[] = [];
  const first = await mutex.lock("k");
  const second = mutex.lock("k").then((l) => {
    order.push("second");
    return l;
  });
  const other = await mutex.lock("other");
  order.push("other");
  const aborter = new AbortController();
  const third = mutex.lock("k", aborter.signal);
  aborter.abort(new Error("gave up"));
  await assert.rejects(third, { message: "gave up" });
  order.push("first-done");
  first[Symbol.dispose]();
  (await second)[Symbol.dispose]();
  other[Symbol.dispose]();
  assert.deepEqual(order, ["other", "first-done", "second"]);
  const again = await mutex.lock("k");
  again[Symbol.dispose]();
});

Deno.test("EventQueue: order kept, producers never wait, end finishes", async () => {
  const queue = new EventQueue<number>();
  for (let i = 0; i < 5000; i++) queue.push(i);
  assert.equal(queue.length, 5000);
  const got: number[] = [];
  const reader = (async () => {
    for await (const v of queue) got.push(v);
  })();
  await sleep(1);
  queue.push(5000);
  queue.end();
  await reader;
  assert.equal(got.length, 5001);
  assert.deepEqual(got.slice(0, 3), [0, 1, 2]);
  assert.equal(got.at(-1), 5000);
});

Deno.test("options: defaults, required finite max, clear errors", () => {
  const s = resolveOptions({ max: 65535, min: 256 });
  assert.equal(s.min, 256);
  assert.equal(s.maxAttempts, 16);
  assert.equal(s.masterKeyProtection, true);
  assert.throws(() => resolveOptions({} as never), (e: unknown) => {
    assert.ok(e instanceof InvalidOptionsError);
    assert.match((e as Error).message, /'max' is required/);
    return true;
  });
  assert.throws(() => resolveOptions({ max: 5, min: 5 }), /greater than minimum/);
  assert.throws(() => resolveOptions({ max: 5, min: 0 }), /'min' must be at least 1/);
  assert.throws(() => resolveOptions({ max: 2 ** 60 }), /safe integer/);
  assert.throws(() => resolveOptions({ max: 1.5 }), InvalidOptionsError);
  assert.throws(() => resolveOptions({ max: 10, maxAttempts: 0 }), /maxAttempts/);
  assert.throws(() => resolveOptions({ max: 10, typo: true } as never), /'typo' is not an option/);
});

Deno.test("IdCache: an own allocation is visible at once; a listing keeps it only if it may have missed it", () => {
  const cache = new IdCache<string>((k) => k.toUpperCase());
  assert.deepEqual(cache.insertLocal("a", 1), { type: "upsert", id: 1, key: "A" });
  assert.equal(cache.insertLocal("a", 1), undefined, "a second insert changes nothing");
  assert.deepEqual(cache.lookup("a"), { id: 1, version: undefined });
  const mark = cache.mark();
  // Inserted before the listing started: a listing that does not show it means it vanished.
  assert.equal(cache.unlisted(1, mark), true);
  assert.deepEqual(cache.insertLocal("b", 2, "v0"), { type: "upsert", id: 2, key: "B" });
  // Inserted after: the listing's snapshot may predate it; the watch that follows reports it.
  assert.equal(cache.unlisted(2, mark), false);
  assert.equal(cache.upsert(2, "b", "B", "v1"), undefined, "the echo publishes nothing");
  assert.deepEqual(cache.lookup("b"), { id: 2, version: "v1" });
  assert.equal(cache.unlisted(2, mark), true, "once echoed, the listing is the judge");
  // A key the codec cannot decode waits for the watch.
  const strict = new IdCache<string>(() => {
    throw new Error("no");
  });
  assert.equal(strict.insertLocal("x", 3), undefined);
  assert.equal(strict.lookup("x"), undefined);
  assert.deepEqual(cache.delete(1), { type: "delete", id: 1, key: "A" });
  assert.equal(cache.lookup("a"), undefined);
});
