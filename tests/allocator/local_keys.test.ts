// Cilium's TestLocalKeys (`pkg/allocator`), adapted to entries that exist only once verified.
import assert from "node:assert/strict";
import { LocalKeys } from "../../src/allocator/local_keys.ts";

Deno.test("LocalKeys: reference counting and reverse lookup", () => {
  const keys = new LocalKeys();
  assert.equal(keys.get("foo"), undefined);
  keys.add("foo", 200);
  assert.equal(keys.get("foo")?.id, 200);
  keys.get("foo")!.refcnt++;
  assert.equal(keys.release("foo"), false);
  assert.equal(keys.get("foo")?.refcnt, 1);
  keys.add("bar", 300);
  assert.equal(keys.keyOf(300), "bar");
  assert.equal(keys.size, 2);
  assert.deepEqual(keys.snapshot().sort((a, b) => a.id - b.id), [
    { key: "foo", id: 200 },
    { key: "bar", id: 300 },
  ]);
  assert.equal(keys.release("foo"), true);
  assert.equal(keys.get("foo"), undefined);
  assert.equal(keys.keyOf(200), undefined);
  assert.equal(keys.release("foo"), false, "a key not held");
  assert.equal(keys.release("bar"), true);
  assert.equal(keys.size, 0);
});
