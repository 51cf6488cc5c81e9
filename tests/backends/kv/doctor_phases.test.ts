/**
 * How the Deno KV damage report judges each listed entry, and whom a finding is held by, on plain
 * data (no store). The report itself (the walk, removal) runs on a real Deno KV in
 * garbage.test.ts.
 */
import assert from "node:assert/strict";
import {
  holdersOf,
  judgeGen,
  judgeIndex,
  judgeLease,
  judgeLog,
  judgeMaster,
  judgeReference,
  judgeTouch,
  type Pending,
  readIndex,
} from "../../../src/backends/kv/doctor.ts";
import { KvLayout } from "../../../src/backends/kv/layout.ts";
import { LiveUse, rangeCheck } from "../../../src/allocator/damage.ts";
import { MAX_KEY_BYTES } from "../../../src/backends/kv/limits.ts";

const layout = new KvLayout(["p"]);
const VS = "00000000000000010000";

function entry(key: Deno.KvKey, value: unknown): Deno.KvEntry<unknown> {
  return { key, value, versionstamp: VS };
}

const absent: Deno.KvEntryMaybe<unknown> = { key: ["p", "id", 7], value: null, versionstamp: null };

/** What a finding says, without its token. */
function said(p: Pending | undefined) {
  if (p === undefined) return undefined;
  const { token: _, ...finding } = p.finding;
  return { ...finding, ...(p.id === undefined ? {} : { id: p.id }) };
}

Deno.test("judgeMaster: a bad ID, an unreadable value, a key too large for the layout", () => {
  assert.equal(judgeMaster(layout, entry(layout.id(7), { key: "k;" })), undefined);
  assert.equal(
    judgeMaster(layout, entry(["p", "id", -1], { key: "k;" }))?.finding.kind,
    "master-bad-id",
  );
  assert.deepEqual(said(judgeMaster(layout, entry(layout.id(7), "garbage"))), {
    kind: "master-undecodable",
    entry: '["p", "id", 7]',
    reason: "the value is not { key: string }",
    id: 7,
  });
  const huge = "k".repeat(MAX_KEY_BYTES);
  const oversized = judgeMaster(layout, entry(layout.id(7), { key: huge }));
  assert.deepEqual([oversized?.finding.kind, oversized?.id], ["master-oversized", 7]);
});

Deno.test("readIndex: an unreadable key index is a finding; a readable one waits for its master", () => {
  const e = entry(layout.key("k;"), { id: 7 });
  assert.deepEqual(readIndex(layout, e), { entry: e, key: "k;", id: 7 });
  const bad = readIndex(layout, entry(layout.key("k;"), { id: "x" })) as Pending;
  assert.deepEqual([bad.finding.kind, bad.key], ["index-undecodable", "k;"]);
});

Deno.test("judgeIndex: an orphan names a missing master or another key's", () => {
  const index = { entry: entry(layout.key("k;"), { id: 7 }), key: "k;", id: 7 };
  const missing = judgeIndex(index, absent, undefined);
  assert.deepEqual([missing?.finding.reason, missing?.key], [
    "it names ID 7, which has no master",
    "k;",
  ]);
  const other = judgeIndex(index, entry(layout.id(7), { key: "x;" }), undefined);
  assert.equal(other?.finding.reason, "it names ID 7, whose master is another key's");
  assert.equal(judgeIndex(index, entry(layout.id(7), { key: "k;" }), undefined), undefined);
});

Deno.test("judgeIndex: outside every valid range only when its master is the key's or unreadable", () => {
  const index = { entry: entry(layout.key("k;"), { id: 7 }), key: "k;", id: 7 };
  const check = rangeCheck({ range: { min: 1, max: 5 } });
  for (const master of [{ key: "k;" }, "unreadable"]) {
    const p = judgeIndex(index, entry(layout.id(7), master), check);
    assert.deepEqual([p?.finding.kind, p?.finding.reason], [
      "index-out-of-range",
      "ID 7 is outside the valid range [1, 5]",
    ]);
  }
  const inRange = rangeCheck({ range: { min: 1, max: 10 } });
  assert.equal(judgeIndex(index, entry(layout.id(7), { key: "k;" }), inRange), undefined);
});

Deno.test("judgeTouch and judgeGen: counters must hold a Deno.KvU64", () => {
  const u64 = new Deno.KvU64(3n);
  assert.equal(judgeTouch(layout, entry(layout.touch("k;"), u64)), undefined);
  const touch = judgeTouch(layout, entry(layout.touch("k;"), 3));
  assert.deepEqual([touch?.finding.kind, touch?.key], ["counter-wrong-type", "k;"]);
  assert.equal(judgeGen(entry(layout.gen(), u64)), undefined);
  assert.equal(judgeGen({ key: layout.gen(), value: null, versionstamp: null }), undefined);
  assert.equal(judgeGen(entry(layout.gen(), "x"))?.finding.reason, "gen must hold a Deno.KvU64");
});

Deno.test("judgeReference: a bad key, an unreadable value, an ID outside every valid range", () => {
  const check = rangeCheck({ range: { min: 1, max: 5 } });
  const ref = (value: unknown) => entry(layout.ref("k;", "a"), value);
  assert.equal(judgeReference(layout, ref({ id: 3, lease: "l" }), check), undefined);
  assert.equal(judgeReference(layout, ref({ id: 7, lease: "l" }), undefined), undefined);
  const out = judgeReference(layout, ref({ id: 7, lease: "l" }), check);
  assert.deepEqual([out?.finding.kind, out?.node, out?.finding.id], [
    "reference-out-of-range",
    "a",
    7,
  ]);
  const unreadable = judgeReference(layout, ref({ id: 7 }), check);
  assert.deepEqual([unreadable?.finding.kind, unreadable?.node], ["reference-undecodable", "a"]);
  const badKey = judgeReference(layout, entry(["p", "ref", "k;"], { id: 3, lease: "l" }), check);
  assert.deepEqual([badKey?.finding.kind, badKey?.node], ["reference-bad-key", undefined]);
});

Deno.test("judgeLease and judgeLog: records of the wrong shape", () => {
  assert.equal(
    judgeLease(layout, entry(layout.lease("a"), { lease: "l", expiresAt: 1 })),
    undefined,
  );
  assert.equal(
    judgeLease(layout, entry(layout.lease("a"), { lease: "l" }))?.finding.kind,
    "lease-undecodable",
  );
  assert.equal(judgeLog(layout, entry(layout.log(1, "a", "n"), { id: 7, key: null })), undefined);
  assert.equal(
    judgeLog(layout, entry(["p", "log", "x"], { id: 7, key: null }))?.finding.kind,
    "log-undecodable",
  );
});

Deno.test("holdersOf: a live reference's node, and the nodes using the ID or key", () => {
  const use = new LiveUse();
  use.watchId(7);
  use.watchKey("k;");
  use.note({ key: "k;", node: "b", id: 7 });
  use.note({ key: "x;", node: "c", id: 7 });
  const finding = { kind: "x", entry: "e", reason: "r", token: "t" };
  assert.deepEqual(holdersOf({ finding, id: 7 }, use, false), ["b", "c"]);
  assert.deepEqual(holdersOf({ finding, key: "k;" }, use, false), ["b"]);
  assert.deepEqual(holdersOf({ finding, node: "a" }, use, true), ["a"]);
  assert.deepEqual(holdersOf({ finding, node: "a" }, use, false), []);
});
