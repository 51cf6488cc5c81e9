// The nemesis history checker must catch planted violations and must not flag correct histories
// whose timing only looks suspicious (IDs legitimately reused after a release and GC, calls whose
// windows overlap without their certain spans overlapping).
import assert from "node:assert/strict";
import {
  buildRuns,
  checkHistory,
  HISTORY_CHECK,
  ID_CHANGE_CHECK,
  SPLIT_CHECK,
} from "../../nemesis/checks/history.ts";
import type { LogRecord } from "../../nemesis/records.ts";

let clockMs = 1_000;

function call(
  node: string,
  op: "allocate" | "release" | "get" | "getNoCache",
  key: string,
  start: number,
  end: number,
  extra: { id?: number; held?: boolean; lastUse?: boolean } = {},
): LogRecord {
  return {
    t: "call",
    node,
    inc: `${node}#1`,
    op,
    key,
    start: clockMs + start,
    end: clockMs + end,
    ok: true,
    held: extra.held ?? op === "get",
    ...extra,
  };
}

function reassigned(
  node: string,
  key: string,
  oldId: number,
  newId: number,
  at: number,
): LogRecord {
  return { t: "reassigned", node, inc: `${node}#1`, key, oldId, newId, at: clockMs + at };
}

Deno.test("history: a stalled node answering a collected ID while another key has it is caught", () => {
  clockMs = 50_000;
  const records: LogRecord[] = [
    // a holds k1 → 300 and answers it before and after its stall.
    call("a", "allocate", "k1", 0, 10, { id: 300 }),
    call("a", "get", "k1", 20, 21, { id: 300 }),
    // Meanwhile (a is stopped) GC collected 300 and b got it for k2.
    call("b", "allocate", "k2", 5_000, 5_010, { id: 300 }),
    call("b", "get", "k2", 5_100, 5_101, { id: 300 }),
    // a wakes up and answers k1 → 300 again.
    call("a", "get", "k1", 9_000, 9_001, { id: 300 }),
  ];
  const result = checkHistory(records);
  assert.equal(result.overlaps.length, 1, JSON.stringify(result.overlaps));
  assert.equal(result.overlaps[0].check, HISTORY_CHECK);
  assert.match(result.overlaps[0].message, /ID 300 was answered for k1 by a and for k2 by b/);
});

Deno.test("history: an ID reused after release and GC is no violation", () => {
  clockMs = 60_000;
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 300 }),
    call("a", "get", "k1", 20, 21, { id: 300 }),
    call("a", "release", "k1", 30, 40, { lastUse: true }),
    // The release's window and the new owner's allocate overlap in time: still legitimate.
    call("b", "allocate", "k2", 35, 2_000, { id: 300 }),
    call("b", "get", "k2", 2_100, 2_101, { id: 300 }),
    // a takes k1 again later and gets another ID.
    call("a", "allocate", "k1", 2_200, 2_210, { id: 301 }),
    call("a", "get", "k1", 2_300, 2_301, { id: 301 }),
  ];
  const result = checkHistory(records);
  assert.deepEqual(result.overlaps, []);
  assert.deepEqual(result.idChanges, []);
});

Deno.test("history: answers whose windows overlap but whose certain spans do not are no violation", () => {
  clockMs = 70_000;
  const records: LogRecord[] = [
    // One slow answer each: points, never conflicting with each other.
    call("a", "allocate", "k1", 0, 1_000, { id: 7 }),
    call("b", "allocate", "k2", 500, 1_500, { id: 7 }),
    // A core [end of first, start of last] = [2_010, 2_020] and a point whose window sticks out.
    call("c", "allocate", "k3", 2_000, 2_010, { id: 8 }),
    call("c", "get", "k3", 2_020, 2_021, { id: 8 }),
    call("d", "getNoCache", "k4", 2_015, 2_030, { id: 8, held: false }),
  ];
  assert.deepEqual(checkHistory(records).overlaps, []);
});

Deno.test("history: a store read inside another key's certain span is caught", () => {
  clockMs = 80_000;
  const records: LogRecord[] = [
    call("c", "allocate", "k3", 0, 10, { id: 8 }),
    call("c", "get", "k3", 1_000, 1_001, { id: 8 }),
    call("d", "getNoCache", "k4", 400, 450, { id: 8, held: false }),
  ];
  const result = checkHistory(records);
  assert.equal(result.overlaps.length, 1);
  assert.match(result.overlaps[0].message, /ID 8 was answered for k3 by c and for k4 by d/);
});

Deno.test("history: cache reads of keys not held are not part of the history", () => {
  clockMs = 90_000;
  const records: LogRecord[] = [
    call("c", "allocate", "k3", 0, 10, { id: 8 }),
    call("c", "get", "k3", 1_000, 1_001, { id: 8 }),
    // A stale cache answer from a node that does not hold k4.
    call("d", "get", "k4", 400, 450, { id: 8, held: false }),
  ];
  assert.deepEqual(checkHistory(records).overlaps, []);
});

Deno.test("history: a reassigned event ends the old ID's run and starts the new one", () => {
  clockMs = 100_000;
  const fenced: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 300 }),
    call("a", "get", "k1", 20, 21, { id: 300 }),
    call("b", "allocate", "k2", 5_000, 5_010, { id: 300 }),
    call("b", "get", "k2", 9_500, 9_501, { id: 300 }),
    // a wakes up, is fenced, re-acquires k1 under 302 and says so before answering again.
    reassigned("a", "k1", 300, 302, 9_000),
    call("a", "get", "k1", 9_100, 9_101, { id: 302 }),
  ];
  const clean = checkHistory(fenced);
  assert.deepEqual(clean.overlaps, []);
  assert.deepEqual(clean.idChanges, []);
  const runs = buildRuns(fenced).runs.filter((r) => r.key === "k1");
  assert.deepEqual(runs.map((r) => [r.id, r.point]), [[300, false], [302, false]]);

  // Answering the retired ID after the event is caught twice: as a stale answer and an overlap.
  const stale = [...fenced, call("a", "get", "k1", 9_600, 9_601, { id: 300 })];
  const result = checkHistory(stale);
  assert.equal(result.idChanges.length, 1);
  assert.equal(result.idChanges[0].check, ID_CHANGE_CHECK);
  assert.match(result.idChanges[0].message, /after a reassigned event retired that ID/);
});

Deno.test("history: a key moved away from an ID and later moved back to it may answer it again", () => {
  clockMs = 150_000;
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 541 }),
    // Fenced once: k1 moves to 543; fenced again after a stall: 541 is free again, k1 moves back.
    reassigned("a", "k1", 541, 543, 3_000),
    call("a", "get", "k1", 5_000, 5_001, { id: 543 }),
    reassigned("a", "k1", 543, 541, 16_000),
    call("a", "get", "k1", 17_000, 17_001, { id: 541 }),
  ];
  assert.deepEqual(checkHistory(records).idChanges, []);
  // 541 answered between the two events is still caught.
  const stale = [...records, call("a", "get", "k1", 9_000, 9_001, { id: 541 })];
  const result = checkHistory(stale);
  assert.equal(result.idChanges.length, 1);
  assert.match(result.idChanges[0].message, /after a reassigned event retired that ID/);
});

Deno.test("history: a held key's ID changing without a reassigned event is caught (plain allocators)", () => {
  clockMs = 110_000;
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 300 }),
    call("a", "get", "k1", 20, 21, { id: 301 }),
  ];
  const result = checkHistory(records);
  assert.equal(result.idChanges.length, 1);
  assert.match(result.idChanges[0].message, /held k1 as 300, then answered 301/);
  // The identity layer reports no event; its workers are exempt.
  assert.deepEqual(
    checkHistory(records, { silentChangeAllowed: new Set(["a#1"]) }).idChanges,
    [],
  );
});

Deno.test("history: one incident is reported once per pair of holders, the rest counted", () => {
  clockMs = 120_000;
  const records: LogRecord[] = [];
  for (let i = 0; i < 40; i++) {
    const id = 1_000 + i;
    records.push(
      call("a", "allocate", `x${i}`, 0, 10, { id }),
      call("a", "get", `x${i}`, 100, 101, { id }),
      call("a", "get", `x${i}`, 200, 201, { id }),
      call("b", "allocate", `y${i}`, 20, 30, { id }),
      call("b", "get", `y${i}`, 150, 151, { id }),
    );
  }
  const result = checkHistory(records, { limit: 10 });
  assert.equal(result.overlaps.length, 10);
  assert.equal(result.dropped[HISTORY_CHECK], 30);
});

Deno.test("history: a heartbeat after a stall extends the hold across it (the stalled-node bug)", () => {
  clockMs = 130_000;
  const hb = (start: number, ids: [string, number][]): LogRecord => ({
    t: "hb",
    node: "a",
    inc: "a#1",
    start: clockMs + start,
    end: clockMs + start + 1,
    ids,
  });
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 385 }),
    hb(250, [["k1", 385]]),
    // a is stopped from 300 to 9_000; GC collects 385 and b's single allocate gets it.
    call("b", "allocate", "k2", 5_000, 5_004, { id: 385 }),
    call("b", "release", "k2", 5_100, 5_110, { lastUse: true }),
    // a wakes up: its first heartbeat still answers the collected ID.
    hb(9_000, [["k1", 385]]),
    call("a", "release", "k1", 9_010, 9_020, { lastUse: true }),
  ];
  const result = checkHistory(records);
  assert.equal(result.overlaps.length, 1);
  assert.match(result.overlaps[0].message, /ID 385 was answered for k1 by a and for k2 by b/);
  // Without the heartbeat after the stall, a's answers never span it: nothing certain to report.
  assert.deepEqual(checkHistory(records.filter((_, i) => i !== 4)).overlaps, []);
});

Deno.test("history: one key answered with two IDs at once by two holders is caught", () => {
  clockMs = 140_000;
  const split: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 510 }),
    call("a", "get", "k1", 5_000, 5_001, { id: 510 }),
    call("b", "allocate", "k1", 1_000, 1_010, { id: 508 }),
    call("b", "get", "k1", 2_000, 2_001, { id: 508 }),
  ];
  const result = checkHistory(split);
  assert.equal(result.splits.length, 1);
  assert.equal(result.splits[0].check, SPLIT_CHECK);
  assert.match(result.splits[0].message, /k1 was answered as 510 by a and as 508 by b at once/);
  // The key moving to a new ID after every holder let go of the old one is no split.
  const moved: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 510 }),
    call("a", "get", "k1", 500, 501, { id: 510 }),
    call("a", "release", "k1", 600, 610, { lastUse: true }),
    call("b", "allocate", "k1", 605, 3_000, { id: 508 }),
    call("b", "get", "k1", 3_100, 3_101, { id: 508 }),
  ];
  assert.deepEqual(checkHistory(moved).splits, []);
});

Deno.test("history: the new ID may be read before the reassigned event arrives", () => {
  clockMs = 150_000;
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 300 }),
    call("a", "get", "k1", 20, 21, { id: 300 }),
    // Woken and fenced: the re-check moved k1 to 302; a read sees it before the watch event.
    call("a", "get", "k1", 9_000, 9_050, { id: 302 }),
    reassigned("a", "k1", 300, 302, 9_060),
    call("a", "get", "k1", 9_100, 9_101, { id: 302 }),
  ];
  const result = checkHistory(records);
  assert.deepEqual(result.idChanges, []);
  // An event for another change does not announce this one.
  const other = records.map((r) => r.t === "reassigned" ? { ...r, oldId: 299 } : r);
  assert.equal(checkHistory(other).idChanges.length, 1);
});

Deno.test("history: a hold silent for longer than its lease starts a new run (ABA across a stall)", () => {
  clockMs = 160_000;
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 415 }),
    call("a", "get", "k1", 250, 251, { id: 415 }),
    // a is stopped 300–10_000: 415 is collected, b uses it for k2 and frees it again.
    call("b", "allocate", "k2", 5_000, 5_004, { id: 415 }),
    call("b", "get", "k2", 5_300, 5_301, { id: 415 }),
    call("b", "release", "k2", 5_400, 5_410, { lastUse: true }),
    // a wakes, re-checks, finds 415 free and keeps it: every answer it gave was true when given.
    call("a", "get", "k1", 10_050, 10_051, { id: 415 }),
    call("a", "get", "k1", 10_300, 10_301, { id: 415 }),
  ];
  assert.deepEqual(checkHistory(records, { maxGapMs: 3_000 }).overlaps, []);
  // Judged as one continuous hold, the stall counts against a.
  assert.equal(checkHistory(records).overlaps.length, 1);
  // Still caught with the gap rule: a wakes and answers 415 while b holds it.
  const stale: LogRecord[] = [
    ...records.slice(0, 4),
    call("a", "get", "k1", 5_200, 5_201, { id: 415 }),
  ];
  assert.equal(checkHistory(stale, { maxGapMs: 3_000 }).overlaps.length, 1);
  // The stop window itself ends the run, as the silence does: a was stopped 300–10_000.
  const stops = [{ inc: "a#1", from: clockMs + 300, to: clockMs + 10_000 }];
  assert.deepEqual(checkHistory(records, { stops }).overlaps, []);
  assert.equal(checkHistory(stale, { stops }).overlaps.length, 1);
  // Another incarnation's stop window excuses nothing here.
  assert.equal(checkHistory(records, { stops: [{ ...stops[0], inc: "b#1" }] }).overlaps.length, 1);
});

Deno.test("history: after a stall window, the node's own answers count (key side, the KV trace)", () => {
  clockMs = 170_000;
  const inc = "w0#1";
  const stops = [{ inc, from: clockMs + 300, to: clockMs + 6_000 }];
  // w0 holds k56 → 15 and is stopped; meanwhile w1 gets k56 → 30 and keeps it.
  const before: LogRecord[] = [
    call("w0", "allocate", "k56", 0, 10, { id: 15 }),
    call("w0", "get", "k56", 250, 251, { id: 15 }),
    call("w1", "allocate", "k56", 4_600, 4_610, { id: 30 }),
    call("w1", "get", "k56", 4_900, 4_901, { id: 30 }),
    call("w1", "get", "k56", 9_900, 9_901, { id: 30 }),
  ];
  // Resumed, w0 answers 15 again twice, without a reassigned event: a split, although nothing it
  // answered before the stall overlaps w1's hold.
  const stale = [
    ...before,
    call("w0", "get", "k56", 7_600, 7_601, { id: 15 }),
    call("w0", "allocate", "k56", 8_900, 8_910, { id: 15 }),
  ];
  const found = checkHistory(stale, { stops });
  assert.equal(found.splits.length, 1);
  assert.match(found.splits[0].message, /k56 was answered as (15|30) by w[01] and as (30|15)/);
  // The stall window alone is excused: the same history with w0's answers only before the stall
  // and a reassigned event to w1's ID after it is clean.
  const moved = [
    ...before,
    reassigned("w0", "k56", 15, 30, 6_100),
    call("w0", "get", "k56", 7_600, 7_601, { id: 30 }),
    call("w0", "get", "k56", 8_900, 8_901, { id: 30 }),
  ];
  const clean = checkHistory(moved, { stops });
  assert.deepEqual([clean.splits, clean.overlaps, clean.idChanges], [[], [], []]);
});

Deno.test("history: a reassigned event during the last release belongs to the hold it ends", () => {
  clockMs = 70_000;
  // The re-check moved k1 from 12 to 30 while its last release waited for the key's lock; the key
  // is later allocated anew as 12: a new hold, which no earlier event retired anything in.
  const records: LogRecord[] = [
    call("a", "allocate", "k1", 0, 10, { id: 12 }),
    call("a", "release", "k1", 100, 140, { lastUse: true, held: true }),
    reassigned("a", "k1", 12, 30, 135),
    call("a", "allocate", "k1", 5_000, 5_010, { id: 12 }),
    call("a", "get", "k1", 5_100, 5_101, { id: 12 }),
  ];
  const result = checkHistory(records);
  assert.deepEqual(result.idChanges, []);
});
