// The cache keeps every master of a key that has more than one, so the fence's re-check can tell
// a held key with a second master from one with a single ID.
import assert from "node:assert/strict";
import { IdCache } from "../../src/allocator/cache.ts";

Deno.test("cache: a second master of a key is known until it goes, then the other stands", () => {
  const cache = new IdCache<string>((k) => k);
  cache.upsert(10, "k", "k", "v1");
  assert.deepEqual(cache.otherIds("k", 10), []);
  cache.upsert(20, "k", "k", "v2");
  assert.deepEqual(cache.otherIds("k", 10), [20]);
  assert.deepEqual(cache.otherIds("k", 20), [10]);
  assert.equal(cache.lookup("k")?.id, 20, "the newest master answers lookups");
  cache.delete(20);
  assert.equal(cache.lookup("k")?.id, 10, "the remaining master stands for the key");
  assert.deepEqual(cache.otherIds("k", 10), []);
  // A master rewritten to another key no longer counts for the first.
  cache.upsert(30, "k", "k", "v3");
  cache.upsert(30, "other", "other", "v4");
  assert.deepEqual(cache.otherIds("k", 10), []);
  assert.equal(cache.lookup("other")?.id, 30);
  cache.delete(10);
  assert.equal(cache.lookup("k"), undefined);
  assert.deepEqual(cache.otherIds("k", 10), []);
});
