// The informer's index on plain data: key → identities follows every change of an identity's key,
// Cilium's answer is the oldest, and resource versions compare as numbers.
import assert from "node:assert/strict";
import { IdentityIndex, newer } from "../../../src/backends/k8s/watch.ts";
import type { IdentityRecord } from "../../../src/backends/k8s/layout.ts";

const rec = (id: number, key: string, created: number, rv = "1"): IdentityRecord => ({
  id,
  key,
  rv,
  created,
  refs: new Map(),
  annotated: false,
});

Deno.test("the index keeps key → identities and answers the oldest", () => {
  const index = new IdentityIndex();
  index.set(rec(7, "k", 2000));
  index.set(rec(5, "k", 3000));
  index.set(rec(9, "j", 1000));
  assert.equal(index.answer("k")?.id, 7);
  assert.deepEqual(index.ofKey("k").map((r) => r.id).sort(), [5, 7]);
  // 7 now carries another key (deleted and re-created): it leaves k's list.
  index.set(rec(7, "j", 4000, "2"));
  assert.equal(index.answer("k")?.id, 5);
  assert.equal(index.answer("j")?.id, 9);
  index.delete(5);
  assert.equal(index.answer("k"), undefined);
  assert.equal(index.size, 2);
});

Deno.test("resource versions compare as numbers when they are", () => {
  assert.equal(newer("10", "9"), true);
  assert.equal(newer("9", "10"), false);
  assert.equal(newer("9", "9"), false);
  assert.equal(newer("a", "b"), true, "opaque versions: any other version is taken as newer");
});
