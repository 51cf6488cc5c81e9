// Cilium's pkg/idpool tests (TestAllocateID, TestLeaseID, …), adapted: selection is hash-hinted, Insert is range-checked.
import assert from "node:assert/strict";
import { IdPool, keyHash } from "../../src/allocator/id_pool.ts";

function leaseAll(pool: IdPool, first: number, last: number): void {
  const ids: number[] = [];
  for (let i = first; i <= last; i++) {
    const id = pool.lease(`k${i}`);
    assert.notEqual(id, undefined);
    ids.push(id!);
  }
  assert.equal(pool.lease("one-more"), undefined);
  assert.deepEqual(ids.sort((a, b) => a - b), range(first, last));
}

function range(a: number, b: number): number[] {
  return Array.from({ length: b - a + 1 }, (_, i) => a + i);
}

Deno.test("IdPool: lease every ID once, then none", () => {
  leaseAll(new IdPool(1, 5), 1, 5);
});

Deno.test("IdPool: insert is bounds-checked (Cilium's out-of-range insert bug is not copied)", () => {
  const pool = new IdPool(2, 6);
  for (let i = 1; i <= 7; i++) {
    assert.equal(pool.insert(i), false, `insert(${i}) of an available or out-of-range ID`);
  }
  leaseAll(pool, 2, 6);
});

Deno.test("IdPool: remove and insert", () => {
  const pool = new IdPool(1, 5);
  for (let i = 1; i <= 5; i++) {
    assert.equal(pool.remove(i), true);
    assert.equal(pool.remove(i), false);
  }
  assert.equal(pool.lease("x"), undefined);
  for (let i = 1; i <= 5; i++) {
    assert.equal(pool.insert(i), true);
    assert.equal(pool.insert(i), false);
  }
  for (const i of [1, 3, 5]) assert.equal(pool.remove(i), true);
  const got = [pool.lease("a"), pool.lease("b")].sort();
  assert.deepEqual(got, [2, 4]);
  assert.equal(pool.lease("c"), undefined);
});

Deno.test("IdPool: release, use and remove of leased IDs", () => {
  const pool = new IdPool(1, 5);
  const leased = range(1, 5).map((i) => pool.lease(`k${i}`)!);
  assert.equal(pool.lease("x"), undefined);
  for (const id of leased) {
    assert.equal(pool.release(id), true);
    assert.equal(pool.release(id), false);
  }
  leaseAll(pool, 1, 5);
  for (let i = 1; i <= 5; i++) assert.equal(pool.remove(i), false, "remove of a leased ID");
  for (let i = 1; i <= 5; i++) assert.equal(pool.release(i), false, "lease was cleared");
  assert.equal(pool.lease("x"), undefined);

  const p2 = new IdPool(1, 5);
  const ids = range(1, 5).map((i) => p2.lease(`k${i}`)!);
  for (const id of ids) {
    assert.equal(p2.use(id), true);
    assert.equal(p2.use(id), false);
  }
  assert.equal(p2.available, 0);
  for (const id of ids) assert.equal(p2.insert(id), true);
  leaseAll(p2, 1, 5);
});

Deno.test("IdPool: operations on available IDs are no-ops except remove", () => {
  const pool = new IdPool(1, 5);
  for (let i = 1; i <= 5; i++) {
    assert.equal(pool.release(i), false);
    assert.equal(pool.use(i), false);
    assert.equal(pool.insert(i), false);
  }
  leaseAll(pool, 1, 5);
});

Deno.test("IdPool: the same key picks the same first candidate, exclusions are honoured", () => {
  const a = new IdPool(256, 65535);
  const b = new IdPool(256, 65535);
  assert.equal(a.lease("app=web;"), b.lease("app=web;"));
  const first = a.lease("x")!;
  a.release(first);
  const second = a.lease("x", new Set([first]))!;
  assert.notEqual(second, first);
  assert.equal(keyHash("abc"), keyHash("abc"));
  assert.notEqual(keyHash("abc"), keyHash("abd"));
});

Deno.test("IdPool: 6000 IDs leased and returned by interleaved users stay unique", () => {
  const pool = new IdPool(1, 6000);
  const seen = new Set<number>();
  for (let i = 0; i < 6000; i++) {
    const id = pool.lease(`key-${i}`)!;
    assert.ok(id >= 1 && id <= 6000);
    assert.equal(seen.has(id), false);
    seen.add(id);
    assert.equal(pool.use(id), true);
  }
  assert.equal(pool.lease("full"), undefined);
  for (const id of seen) assert.equal(pool.insert(id), true);
  assert.equal(pool.available, 6000);
});
