/**
 * The phases of etcd's `ensure` on plain data (no etcd): how a held key is judged from its read,
 * which guarded write it gets, and what its transaction's response makes of it. The protocol itself
 * runs on a real etcd in tests/conformance/key_side.test.ts and cilium_lock.test.ts.
 */
import assert from "node:assert/strict";
import type { IRequestOp } from "../../../src/deps/etcd3.ts";
import {
  classify,
  type KeyRead,
  type Pending,
  plan,
  type Planned,
  settle,
} from "../../../src/backends/etcd/ensure.ts";
import { EtcdLayout } from "../../../src/backends/etcd/layout.ts";
import { MutexGuard, snapshotOf, text } from "../../../src/backends/etcd/txn.ts";
import { kv, nestedTxn, ranged, txn } from "./_plain.ts";

const layout = new EtcdLayout("p");
const held = { key: "k;", id: 7 };
const pending: Pending = { index: 0, held, guards: [] };
const LEASE = "1001";

/** A read of `held`: its master's value (absent when `undefined`) and references node → [id, lease]. */
function keyRead(
  master: string | Uint8Array | undefined,
  refs: Record<string, [string, string]> = {},
  locked: string[] = [],
): KeyRead {
  const kvs = Object.entries(refs).map(([node, [id, lease]]) =>
    kv(layout.refKey(held.key, node), id, "6", lease)
  );
  return {
    master: master === undefined ? undefined : kv(layout.masterKey(held.id), master),
    refs: snapshotOf(layout.refPrefix(held.key), kvs, "9"),
    locked,
  };
}

/** The compare targets of a nested op, as `<target> <result>` strings. */
function compares(op: IRequestOp): string[] {
  return op.request_txn!.compare!.map((c) => `${c.target} ${c.result} ${text(c.key)}`);
}

function checked(read: KeyRead) {
  const verdict = classify(held, read);
  assert.equal(verdict.kind, "check");
  return verdict as Extract<typeof verdict, { kind: "check" }>;
}

Deno.test("classify: a held mutex makes a key busy before anything else is judged", () => {
  assert.deepEqual(classify(held, keyRead("other;", {}, ["p/locks/k;/1"])), {
    kind: "busy",
    locks: ["p/locks/k;/1"],
  });
});

Deno.test("classify: a master of another key, or a leased reference to another ID, is a conflict", () => {
  assert.deepEqual(classify(held, keyRead("other;")), {
    kind: "conflict",
    master: "other;",
    refs: [],
  });
  assert.deepEqual(classify(held, keyRead(undefined, { b: ["8", "77"] })), {
    kind: "conflict",
    master: undefined,
    refs: ["8"],
  });
});

Deno.test("classify: a reference without a lease or with a corrupt value says nothing", () => {
  assert.deepEqual(classify(held, keyRead("k;", { b: ["8", "0"], c: ["x", "77"] })), {
    kind: "check",
    master: "ok",
    masterMod: "5",
  });
});

Deno.test("classify: a missing master, and an unreadable one (names nobody), may be re-created", () => {
  assert.deepEqual(classify(held, keyRead(undefined)), { kind: "check", master: "missing" });
  assert.deepEqual(classify(held, keyRead("")), {
    kind: "check",
    master: "corrupt",
    masterMod: "5",
  });
  assert.deepEqual(classify(held, keyRead(new Uint8Array([0xff, 0xfe]))), {
    kind: "check",
    master: "corrupt",
    masterMod: "5",
  });
});

Deno.test("plan: an intact master and this node's reference on its lease need no write", () => {
  const read = keyRead("k;", { a: ["7", LEASE] });
  assert.deepEqual(plan(layout, "a", pending, read, checked(read), LEASE), {
    ...held,
    master: "ok",
    reference: "ok",
  });
});

Deno.test("plan: a reference on another lease is re-put through the agreement ladder", () => {
  const read = keyRead("k;", { a: ["7", "999"] });
  const step = plan(layout, "a", pending, read, checked(read), LEASE) as Planned;
  assert.deepEqual([step.master, step.ref, step.lease], ["ok", true, LEASE]);
  assert.deepEqual(compares(step.op), ["Value Equal p/id/7"]);
  // The ladder's first step: every reference says 7.
  const ladder = step.op.request_txn!.success![0].request_txn!;
  assert.deepEqual(ladder.compare!.map((c) => [c.target, text(c.value)]), [["Value", "7"]]);
});

Deno.test("plan: a missing master is re-created only if the ID is free and no reference appeared", () => {
  const read = keyRead(undefined, { a: ["7", LEASE] });
  const step = plan(layout, "a", pending, read, checked(read), LEASE) as Planned;
  assert.deepEqual([step.master, step.ref], ["recreated", false]);
  assert.deepEqual(compares(step.op), ["Version Equal p/id/7", "Mod Less p/value/k;/"]);
  assert.deepEqual(step.op.request_txn!.compare![1].mod_revision, "10");
  // Only the master: the reference is already right.
  assert.deepEqual(
    step.op.request_txn!.success!.map((o) => text(o.request_put!.key)),
    ["p/id/7"],
  );
});

Deno.test("plan: an unreadable master is rewritten only while unchanged, with the reference", () => {
  const read = keyRead("");
  const step = plan(layout, "a", pending, read, checked(read), LEASE) as Planned;
  assert.deepEqual([step.master, step.ref], ["recreated", true]);
  assert.deepEqual(compares(step.op), ["Mod Equal p/id/7", "Mod Less p/value/k;/"]);
  assert.deepEqual(
    step.op.request_txn!.success!.map((o) => [text(o.request_put!.key), o.request_put!.lease]),
    [["p/id/7", 0], ["p/value/k;/a", LEASE]],
  );
});

Deno.test("plan: Cilium's mutexes guard the write and are read when it fails", () => {
  const guards = [new MutexGuard(layout.keyLockPath(held.key))];
  const read = keyRead(undefined);
  const step = plan(layout, "a", { ...pending, guards }, read, checked(read), LEASE) as Planned;
  assert.deepEqual(compares(step.op).at(-1), "Version Equal p/locks/k;/");
  assert.equal(step.op.request_txn!.failure!.length, 1);
});

const ladderApplied = nestedTxn(true);
const ladderFailed = nestedTxn(false, [nestedTxn(false, [ranged([])])]);

function planned(master: "ok" | "recreated", ref: boolean, guards: MutexGuard[] = []): Planned {
  return { p: { ...pending, guards }, op: {} as IRequestOp, master, ref, lease: LEASE };
}

Deno.test("settle: an applied write reports what it re-created", () => {
  assert.deepEqual(settle(planned("recreated", false), txn(true), "12", false), {
    ...held,
    master: "recreated",
    reference: "ok",
  });
  assert.deepEqual(settle(planned("ok", true), txn(true, [ladderApplied]), "12", false), {
    ...held,
    master: "ok",
    reference: "recreated",
  });
});

Deno.test("settle: a lost race is retried, and a conflict on the last pass", () => {
  assert.equal(settle(planned("recreated", true), txn(false), "12", false), "retry");
  assert.equal(settle(planned("ok", true), txn(true, [ladderFailed]), "12", false), "retry");
  assert.equal(settle(planned("ok", true), undefined, "12", false), "retry");
  assert.deepEqual(settle(planned("ok", true), txn(true, [ladderFailed]), "12", true), {
    ...held,
    master: "conflict",
    reference: "skipped",
  });
});

Deno.test("settle: a write refused by a held Cilium mutex makes the key busy", () => {
  const guard = new MutexGuard(layout.keyLockPath(held.key));
  guard.learn([], "3"); // an earlier read found it free: "unchanged since 3"
  assert.equal(guard.compare().target, "Mod");
  const res = txn(false, [ranged([kv("p/locks/k;/1a", "")])]);
  assert.deepEqual(settle(planned("recreated", true, [guard]), res, "12", true), {
    ...held,
    master: "busy",
    reference: "skipped",
  });
  // The guard learnt it: the next write requires the mutex absent again.
  assert.equal(guard.compare().target, "Version");
});
