/**
 * The phases of etcd's `acquire` on plain data (no etcd): which round comes next from what the
 * call knows, the guarded transaction of each kind of write, and what a response teaches the next
 * round. The protocol itself runs on a real etcd in acquire.test.ts and the conformance suite.
 */
import assert from "node:assert/strict";
import {
  type Knowledge,
  plan,
  settle,
  type WritePlan,
  writeTxn,
} from "../../../src/backends/etcd/acquire.ts";
import { EtcdLayout } from "../../../src/backends/etcd/layout.ts";
import {
  MutexGuard,
  prefixRange,
  put,
  type RefSnapshot,
  snapshotOf,
  text,
} from "../../../src/backends/etcd/txn.ts";
import type { TxnResult } from "../../../src/backends/etcd/batch.ts";
import {
  CorruptEntryError,
  KeyLockedError,
  PoolExhaustedError,
  SplitKeyError,
} from "../../../src/errors.ts";
import { kv, nestedTxn, ranged } from "./_plain.ts";
import { picker } from "./_helpers.ts";

const layout = new EtcdLayout("p");
const KEY = "k;";
const putRef = put(layout.refKey(KEY, "a"), "7", "1001");

function knowledge(partial: Partial<Knowledge> = {}): Knowledge {
  return { masters: new Map(), excluded: new Set(), owners: new Map(), ...partial };
}

/** A read of `key`'s references at revision 9: node → [id, lease]. */
function refs(key: string, byNode: Record<string, [string, string]>): RefSnapshot {
  const kvs = Object.entries(byNode).map(([node, [id, lease]]) =>
    kv(layout.refKey(key, node), id, "6", lease)
  );
  return snapshotOf(layout.refPrefix(key), kvs, "9");
}

const req = (...ids: number[]) => ({ pickCandidate: picker(...ids) });

Deno.test("plan: a key nobody knows gets the first candidate", () => {
  assert.deepEqual(plan(knowledge(), KEY, req(7), layout), { kind: "new", id: 7 });
});

Deno.test("plan: a hint is joined unless its master turned out to be another key's", () => {
  const hint = { id: 5, version: "3" };
  assert.deepEqual(plan(knowledge({ hint }), KEY, req(7), layout), { kind: "existing", id: 5 });
  const k = knowledge({ hint, masters: new Map([[5, { value: "x;", mod: "3", corrupt: false }]]) });
  assert.deepEqual(plan(k, KEY, req(5, 7), layout), { kind: "new", id: 7 });
  assert.deepEqual([...k.excluded], [5]);
});

Deno.test("plan: agreeing live references decide the ID; a master is re-created or repaired", () => {
  const snapshot = refs(KEY, { b: ["8", "77"], c: ["8", "78"] });
  assert.deepEqual(plan(knowledge({ snapshot }), KEY, req(7), layout), { kind: "existing", id: 8 });
  const gone = knowledge({ snapshot, masters: new Map([[8, null]]) });
  assert.deepEqual(plan(gone, KEY, req(7), layout), { kind: "recreate", id: 8 });
  const corrupt = knowledge({
    snapshot,
    masters: new Map([[8, { value: "", mod: "4", corrupt: true }]]),
  });
  assert.deepEqual(plan(corrupt, KEY, req(7), layout), { kind: "repair", id: 8, mod: "4" });
});

Deno.test("plan: a split key joins its newest master among the IDs its references name", () => {
  const snapshot = refs(KEY, { b: ["8", "77"], c: ["9", "78"] });
  // The masters it does not know yet are read first.
  assert.deepEqual(plan(knowledge({ snapshot }), KEY, req(7), layout), {
    kind: "readMasters",
    ids: [8, 9],
  });
  // Cilium's lookup answers the newest master naming the key: 8 (mod 40), not 9 (mod 30).
  const masters = new Map([
    [8, { value: KEY, mod: "40", corrupt: false }],
    [9, { value: KEY, mod: "30", corrupt: false }],
  ]);
  assert.deepEqual(plan(knowledge({ snapshot, masters }), KEY, req(7), layout), {
    kind: "joinSplit",
    id: 8,
    mod: "40",
  });
  // None of them names the key: nothing to converge on.
  const others = new Map([[8, { value: "x;", mod: "40", corrupt: false }], [9, null]]);
  assert.throws(
    () => plan(knowledge({ snapshot, masters: others }), KEY, req(7), layout),
    SplitKeyError,
  );
  // One without a lease says nothing.
  const unleased = refs(KEY, { b: ["8", "77"], c: ["9", "0"] });
  assert.deepEqual(plan(knowledge({ snapshot: unleased }), KEY, req(7), layout), {
    kind: "existing",
    id: 8,
  });
});

Deno.test("plan: a master naming another key is read before it is judged, then repaired or refused", () => {
  const snapshot = refs(KEY, { b: ["8", "77"] });
  const masters = new Map([[8, { value: "x;", mod: "4", corrupt: false }]]);
  assert.deepEqual(plan(knowledge({ snapshot, masters }), KEY, req(7), layout), {
    kind: "readOwner",
    id: 8,
    owner: "x;",
  });
  // The named key holds no live reference to 8: the master is this key's, guarded on that read.
  const stale = knowledge({ snapshot, masters, owners: new Map([["x;", refs("x;", {})]]) });
  const repair = plan(stale, KEY, req(7), layout);
  assert.equal(repair.kind, "repair");
  assert.deepEqual(repair.kind === "repair" && repair.owner?.revision, "9");
  // It does: the store is inconsistent.
  const owned = refs("x;", { d: ["8", "79"] });
  const both = knowledge({ snapshot, masters, owners: new Map([["x;", owned]]) });
  assert.throws(() => plan(both, KEY, req(7), layout), CorruptEntryError);
});

Deno.test("plan: an empty pool reads the key's references before it gives up", () => {
  assert.deepEqual(plan(knowledge(), KEY, req(), layout), { kind: "read" });
  const read = knowledge({ snapshot: refs(KEY, {}) });
  assert.throws(() => plan(read, KEY, req(), layout), PoolExhaustedError);
});

/** The compares of a transaction as `<target> <result> <key>`. */
function compares(t: ReturnType<typeof writeTxn>): string[] {
  return t.compare!.map((c) => `${c.target} ${c.result} ${text(c.key)}`);
}

Deno.test("writeTxn: a new master needs a free ID and a key without references", () => {
  const t = writeTxn(layout, knowledge(), KEY, { kind: "new", id: 7 }, putRef, []);
  assert.deepEqual(compares(t), ["Version Equal p/id/7", "Version Equal p/value/k;/"]);
  assert.deepEqual(t.success!.map((o) => text(o.request_put!.key)), ["p/id/7", "p/value/k;/a"]);
  assert.deepEqual(t.failure!.map((o) => text(o.request_range!.key)), ["p/value/k;/", "p/id/7"]);
  // After a read that saw references of longer keys: "nothing changed since".
  const seen = knowledge({ snapshot: refs(KEY, {}) });
  const again = writeTxn(layout, seen, KEY, { kind: "new", id: 7 }, putRef, []);
  assert.deepEqual(compares(again)[1], "Mod Less p/value/k;/");
});

Deno.test("writeTxn: joining checks the master and puts the reference through the ladder", () => {
  const t = writeTxn(layout, knowledge(), KEY, { kind: "existing", id: 7 }, putRef, []);
  assert.deepEqual(compares(t), ["Value Equal p/id/7"]);
  assert.ok(t.success![0].request_txn, "the agreement ladder");
});

Deno.test("writeTxn: a repair is guarded by the master's revision and both reads", () => {
  const snapshot = refs(KEY, { b: ["8", "77"] });
  const owner = { range: prefixRange(layout.refPrefix("x;") + "/"), revision: "9" };
  const p: WritePlan = { kind: "repair", id: 8, mod: "4", owner };
  const t = writeTxn(layout, knowledge({ snapshot }), KEY, p, putRef, []);
  assert.deepEqual(compares(t), [
    "Mod Equal p/id/8",
    "Mod Less p/value/k;/",
    "Mod Less p/value/x;/",
  ]);
});

Deno.test("writeTxn: joining a split key is guarded by its master's revision and the read", () => {
  const snapshot = refs(KEY, { b: ["8", "77"], c: ["9", "78"] });
  const p: WritePlan = { kind: "joinSplit", id: 8, mod: "40" };
  const t = writeTxn(layout, knowledge({ snapshot }), KEY, p, putRef, []);
  assert.deepEqual(compares(t), ["Mod Equal p/id/8", "Mod Less p/value/k;/"]);
  assert.deepEqual(t.success!.map((o) => text(o.request_put!.key)), ["p/value/k;/a"]);
  assert.deepEqual(settle(knowledge({ snapshot }), layout, KEY, p, [], result(true)), {
    id: 8,
    created: false,
    version: "40",
  });
});

Deno.test("writeTxn: Cilium's mutexes are compared and read on failure", () => {
  const guards = [new MutexGuard(layout.keyLockPath(KEY)), new MutexGuard(layout.idLockPath(7))];
  const t = writeTxn(layout, knowledge(), KEY, { kind: "new", id: 7 }, putRef, guards);
  assert.deepEqual(compares(t).slice(2), [
    "Version Equal p/locks/k;/",
    "Version Equal p/locks/id/7/",
  ]);
  assert.equal(t.failure!.length, 4);
});

function result(succeeded: boolean, responses: TxnResult["responses"] = []): TxnResult {
  return { succeeded, responses, revision: "12" };
}

Deno.test("settle: a written master is the key's ID at the write's revision", () => {
  const k = knowledge();
  assert.deepEqual(settle(k, layout, KEY, { kind: "new", id: 7 }, [], result(true)), {
    id: 7,
    created: true,
    version: "12",
  });
  const repaired = settle(k, layout, KEY, { kind: "repair", id: 8, mod: "4" }, [], result(true));
  assert.deepEqual(repaired, { id: 8, created: false, version: "12" });
});

Deno.test("settle: a joined ID keeps the master's version (read, or the hint's)", () => {
  const p: WritePlan = { kind: "existing", id: 7 };
  const applied = result(true, [nestedTxn(true)]);
  const hinted = knowledge({ hint: { id: 7, version: "3" } });
  assert.deepEqual(settle(hinted, layout, KEY, p, [], applied), {
    id: 7,
    created: false,
    version: "3",
  });
  const read = knowledge({ masters: new Map([[7, { value: KEY, mod: "4", corrupt: false }]]) });
  assert.deepEqual(settle(read, layout, KEY, p, [], applied)?.version, "4");
});

Deno.test("settle: a ladder that did not apply leaves its range read for the next round", () => {
  const k = knowledge();
  const refused = result(true, [
    nestedTxn(false, [nestedTxn(false, [ranged([kv(layout.refKey(KEY, "b"), "9", "6", "77")])])]),
  ]);
  assert.equal(settle(k, layout, KEY, { kind: "existing", id: 7 }, [], refused), undefined);
  assert.deepEqual([k.snapshot?.exact.map((r) => r.id), k.snapshot?.revision], [[9], "12"]);
});

Deno.test("settle: a failed write records the master and the references it read", () => {
  // The candidate's master is this very key's: it becomes the hint, and is not excluded.
  const k = knowledge();
  const mine = result(false, [ranged([]), ranged([kv("p/id/7", KEY, "4")])]);
  assert.equal(settle(k, layout, KEY, { kind: "new", id: 7 }, [], mine), undefined);
  assert.deepEqual(k.hint, { id: 7, version: "4" });
  assert.deepEqual(k.masters.get(7), { value: KEY, mod: "4", corrupt: false });
  // Another key's: excluded. A free one (only the reference guard failed): still a good pick.
  const taken = result(false, [ranged([]), ranged([kv("p/id/7", "x;", "4")])]);
  settle(k, layout, KEY, { kind: "new", id: 7 }, [], taken);
  assert.deepEqual([...k.excluded], [7]);
  const free = knowledge();
  settle(free, layout, KEY, { kind: "new", id: 9 }, [], result(false, [ranged([]), ranged([])]));
  assert.deepEqual([...free.excluded], []);
  assert.equal(free.masters.get(9), null);
});

Deno.test("settle: a held Cilium mutex ends the call with KeyLockedError", () => {
  const guards = [new MutexGuard(layout.keyLockPath(KEY))];
  const locked = result(false, [ranged([]), ranged([]), ranged([kv("p/locks/k;/1a", "")])]);
  assert.throws(
    () => settle(knowledge(), layout, KEY, { kind: "new", id: 7 }, guards, locked),
    KeyLockedError,
  );
});
