/**
 * The fence's bookkeeping: raises and verifications are ordered by generations, so a re-check
 * never clears what was raised after it started.
 */
import assert from "node:assert/strict";
import { Fence } from "../../src/allocator/fence.ts";

Deno.test("fence: down at first; a conflict makes one key suspect until verified", () => {
  const fence = new Fence();
  assert.equal(fence.active, false);
  assert.equal(fence.isSuspect("a"), false);
  const at = fence.raise("a");
  assert.equal(fence.active, true);
  assert.equal(fence.isSuspect("a"), true);
  assert.equal(fence.isSuspect("b"), false);
  fence.verified("a", at - 1);
  assert.equal(fence.isSuspect("a"), true, "a re-check older than the raise proves nothing");
  fence.verified("a", at);
  assert.equal(fence.active, false);
  assert.deepEqual(
    { conflicts: fence.status().conflicts, since: fence.status().since },
    { conflicts: 1, since: undefined },
  );
});

Deno.test("fence: a lapse makes every key suspect; keys clear one by one, the rest with the pass", () => {
  const fence = new Fence();
  fence.raiseAll("lease lapsed");
  const gen = fence.generation;
  assert.ok(fence.isSuspect("a") && fence.isSuspect("b"));
  assert.equal(fence.status().all, true);
  fence.verified("a", gen);
  assert.equal(fence.isSuspect("a"), false);
  assert.equal(fence.isSuspect("b"), true);
  // Another lapse during the pass: the pass that started before it clears nothing of it.
  fence.raiseAll("lease replaced");
  assert.equal(fence.isSuspect("a"), true);
  fence.passCompleted(gen);
  assert.equal(fence.active, true);
  fence.passCompleted(fence.generation);
  assert.equal(fence.active, false);
  assert.deepEqual(
    { lapses: fence.status().lapses, replacements: fence.status().replacements },
    { lapses: 1, replacements: 1 },
  );
});

Deno.test("fence: a released key is forgotten; waiters wake when their key clears", async () => {
  const fence = new Fence();
  const at = fence.raise("a");
  fence.raise("b");
  let woke = false;
  const waiting = fence.until("a", new AbortController().signal).then(() => (woke = true));
  fence.raise("c");
  fence.forget("c");
  await Promise.resolve();
  assert.equal(woke, false, "another key's change does not release the wait");
  fence.verified("a", at);
  await waiting;
  assert.equal(woke, true);
  assert.equal(fence.active, true, "b is still suspect");
  fence.forget("b");
  assert.equal(fence.active, false);
});

Deno.test("fence: a wait ends with the signal's reason", async () => {
  const fence = new Fence();
  fence.raiseAll("lease lapsed");
  const controller = new AbortController();
  const waiting = fence.until(undefined, controller.signal);
  controller.abort(new DOMException("gone", "TimeoutError"));
  await assert.rejects(waiting, (e) => e instanceof DOMException && e.name === "TimeoutError");
});
