// The nemesis store and call checkers must catch planted violations: two masters for one key, a
// key with two live IDs, a reference to another key's master, a hold without its master, a hung
// call, an untyped error.
import assert from "node:assert/strict";
import { checkStore, STORE_CHECKS } from "../../nemesis/checks/store.ts";
import type { StoreSnapshot } from "../../src/testing/nemesis.ts";
import { checkCalls, ERROR_CHECK, HANG_CHECK } from "../../nemesis/checks/calls.ts";
import type { LogRecord } from "../../nemesis/records.ts";

function snapshot(partial: Partial<StoreSnapshot>): StoreSnapshot {
  return { at: 0, masters: [], refs: [], strictMasters: true, skipped: {}, ...partial };
}

const healthy = snapshot({
  masters: [{ id: 300, key: "k1" }, { id: 301, key: "k2" }],
  index: [{ key: "k1", id: 300 }, { key: "k2", id: 301 }],
  refs: [
    { key: "k1", node: "a", id: 300, live: true },
    { key: "k1", node: "b", id: 300, live: true },
    { key: "k2", node: "a", id: 301, live: true },
    // A dead reference to a collected ID is no violation.
    { key: "k3", node: "gone", id: 999, live: false },
  ],
});

Deno.test("store checks: a healthy store passes", () => {
  const result = checkStore(healthy, [{ node: "a", inc: "a#1", holds: { k1: 300, k2: 301 } }]);
  assert.deepEqual(result.violations, []);
});

Deno.test("store checks: two masters for one key are caught on Deno KV, counted on etcd", () => {
  const twoMasters = snapshot({
    ...healthy,
    masters: [...healthy.masters, { id: 302, key: "k1" }],
    index: undefined,
  });
  const kv = checkStore(twoMasters, []);
  assert.deepEqual(kv.violations.map((v) => v.check), [STORE_CHECKS.oneMaster]);
  assert.match(kv.violations[0].message, /key k1 has masters 300, 302/);
  const etcd = checkStore({ ...twoMasters, strictMasters: false }, []);
  assert.deepEqual(etcd.violations, []);
  assert.equal(etcd.staleDuplicates, 1);
});

Deno.test("store checks: a key index that disagrees with its master is caught (Deno KV)", () => {
  const result = checkStore(
    snapshot({ ...healthy, index: [{ key: "k1", id: 301 }, { key: "k2", id: 301 }] }),
    [],
  );
  const messages = result.violations.map((v) => v.message);
  assert.ok(messages.includes("key index k1 → 301, but master 301 is k2"), messages.join("\n"));
  assert.ok(messages.some((m) => m.startsWith("master 300 → k1 is not its key's index entry")));
});

Deno.test("store checks: a key with live references to two IDs is caught", () => {
  const result = checkStore(
    snapshot({
      ...healthy,
      masters: [...healthy.masters, { id: 302, key: "k1" }],
      index: undefined,
      strictMasters: false,
      refs: [...healthy.refs, { key: "k1", node: "c", id: 302, live: true }],
    }),
    [],
  );
  assert.deepEqual(result.violations.map((v) => v.check), [STORE_CHECKS.oneLiveId]);
  assert.match(result.violations[0].message, /k1 has live references to IDs 300, 302/);
});

Deno.test("store checks: a live reference naming another key's master is caught", () => {
  const result = checkStore(
    snapshot({
      ...healthy,
      index: undefined,
      refs: [...healthy.refs, { key: "k9", node: "c", id: 301, live: true }],
    }),
    [],
  );
  assert.deepEqual(result.violations.map((v) => v.check), [STORE_CHECKS.oneKey]);
  assert.match(result.violations[0].message, /k9@c names ID 301, whose master is k2/);
});

Deno.test("store checks: a hold whose master is gone or names another key is caught", () => {
  const result = checkStore(healthy, [
    { node: "a", inc: "a#1", holds: { k1: 300, k2: 302 } },
    { node: "b", inc: "b#2", holds: { k2: 301 } },
  ]);
  const messages = result.violations.map((v) => v.message);
  assert.deepEqual(result.violations.map((v) => v.check), [STORE_CHECKS.holds, STORE_CHECKS.holds]);
  assert.match(messages[0], /a \(a#1\) holds k2 → 302; master 302 is absent/);
  assert.match(
    messages[1],
    /b \(b#2\) holds k2 → 301; master 301 is k2, its live reference names nothing/,
  );
});

function failed(error: string, typed: boolean, retryable: boolean, deadline = false): LogRecord {
  return {
    t: "call",
    node: "a",
    inc: "a#1",
    op: "allocate",
    key: "k1",
    start: 0,
    end: 10,
    ok: false,
    held: false,
    error,
    message: "boom",
    typed,
    retryable,
    deadline,
  };
}

Deno.test("call checks: documented failures pass, untyped and unexpected ones are caught", () => {
  const records = [
    failed("AllocationFailedError", true, false),
    failed("StoreUnavailableError", true, true),
    failed("TimeoutError", false, false, true),
    failed("TypeError", false, false),
    failed("KeyNotHeldError", true, false),
  ];
  const result = checkCalls(records, { callTimeoutMs: 1_000 });
  assert.deepEqual(result.errors.map((v) => v.check), [ERROR_CHECK, ERROR_CHECK]);
  assert.match(result.errors[0].message, /untyped TypeError/);
  assert.match(result.errors[1].message, /non-retryable typed KeyNotHeldError/);
  const outcomes = result.outcomes.get("allocate")!;
  assert.equal(outcomes.ok, 0);
  assert.equal(outcomes.errors.get("AllocationFailedError"), 1);
  // Beside Cilium nodes a key Cilium split is refused with SplitKeyError: allowed there only.
  const split = [failed("SplitKeyError", true, false)];
  assert.equal(checkCalls(split, { callTimeoutMs: 1_000 }).errors.length, 1);
  const alsoAllowed = new Set(["SplitKeyError"]);
  assert.deepEqual(checkCalls(split, { callTimeoutMs: 1_000, alsoAllowed }).errors, []);
});

Deno.test("call checks: a call past its deadline is caught unless its worker was stopped", () => {
  const slow: LogRecord = {
    t: "call",
    node: "a",
    inc: "a#1",
    op: "get",
    key: "k1",
    start: 0,
    end: 9_000,
    ok: true,
    held: true,
    id: 300,
  };
  const hang: LogRecord = {
    t: "hang",
    node: "b",
    inc: "b#1",
    op: "allocate",
    key: "k2",
    start: 0,
    at: 30_000,
  };
  const caught = checkCalls([slow, hang], { callTimeoutMs: 2_000, lateMs: 500 });
  assert.deepEqual(caught.hangs.map((v) => v.check), [HANG_CHECK, HANG_CHECK]);
  const stopped = checkCalls([slow], {
    callTimeoutMs: 2_000,
    lateMs: 500,
    stops: [{ inc: "a#1", from: 1_000, to: 8_000 }],
  });
  assert.deepEqual(stopped.hangs, []);
});
