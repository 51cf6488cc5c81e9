// The attribution of a mixed run's violations (idalloc + Cilium nodes), on plain records and a
// plain store record: each class, what makes a mixed violation idalloc's, and the evidence each
// one carries (the writer of the conflicting master, agreement with a Cilium node, the time since
// the last fault, the reassigned event).
import assert from "node:assert/strict";
import {
  attribute,
  type AttributionInput,
  splitRefusals,
} from "../../nemesis/checks/attribution.ts";
import { ERROR_CHECK } from "../../nemesis/checks/calls.ts";
import { checkHistory } from "../../nemesis/checks/history.ts";
import { type StoreChange, StoreHistory } from "../../nemesis/checks/store_history.ts";
import type { FaultRecord } from "../../nemesis/faults.ts";
import type { CallFailed, LogRecord } from "../../nemesis/records.ts";
import type { Violation } from "../../nemesis/checks/violation.ts";

const T = 1_000_000;
const K = "k8s:app=k14;";
const K2 = "k8s:app=k46;";

/** A successful call of `inc` (`node@…`), held unless it is a store read. */
function answer(
  inc: string,
  op: "allocate" | "get" | "getNoCache",
  key: string,
  id: number,
  start: number,
  end = start + 5,
): LogRecord {
  return {
    t: "call",
    node: inc.split("@")[0],
    inc,
    op,
    key,
    id,
    start: T + start,
    end: T + end,
    ok: true,
    held: op === "get",
  };
}

function master(rev: number, at: number, id: number, key: string | null): StoreChange {
  return { t: "master", rev, at: T + at, id, key };
}

function ref(rev: number, at: number, key: string, node: string, id: number | null): StoreChange {
  return { t: "ref", rev, at: T + at, key, node, id, lease: id === null ? undefined : "7" };
}

const CILIUM = { ciliumIncs: new Set(["c0@c1", "c1@c2"]), ciliumNodes: new Set(["c0", "c1"]) };

function input(
  store: StoreChange[],
  records: LogRecord[],
  extra: Partial<AttributionInput> = {},
): AttributionInput {
  return {
    ...CILIUM,
    store: new StoreHistory(store),
    faults: [],
    stops: [],
    records,
    leaseTtlMs: 3_000,
    ...extra,
  };
}

function classify(records: LogRecord[], store: StoreChange[], extra?: Partial<AttributionInput>) {
  const h = checkHistory(records);
  return attribute([...h.overlaps, ...h.splits], input(store, records, extra));
}

Deno.test("attribution: two Cilium nodes answering one key with two IDs is Cilium-only", () => {
  const records = [
    answer("c0@c1", "allocate", K, 71, 0),
    answer("c0@c1", "get", K, 71, 3_000),
    answer("c1@c2", "allocate", K, 73, 1_000),
    answer("c1@c2", "get", K, 73, 2_000),
  ];
  const s = classify(records, []);
  assert.equal(s.counts["Cilium-only"], 1);
  assert.equal(s.attributions[0].class, "Cilium-only");
  assert.equal(s.storeChanges, 0);
});

Deno.test("attribution: two idalloc nodes answering one ID for two keys is idalloc-only", () => {
  const records = [
    answer("w0@1", "allocate", K, 33, 0),
    answer("w0@1", "get", K, 33, 3_000),
    answer("w1@2", "allocate", K2, 33, 1_000),
    answer("w1@2", "get", K2, 33, 2_000),
  ];
  const s = classify(records, []);
  assert.equal(s.counts["idalloc-only"], 1);
  assert.equal(s.attributions[0].conflict.kind, "overlap");
});

Deno.test("attribution: a Cilium node answering from memory after its reference vanished is inherited", () => {
  // c0 holds K → 28; its lease expires (its reference goes) and GC deletes master 28; idalloc's w0
  // finds K unreferenced and creates 45 with its reference in one transaction; c0 keeps answering
  // 28 from its local keys.
  const store = [
    master(10, 0, 28, K),
    ref(11, 0, K, "c0", 28),
    ref(20, 1_000, K, "c0", null),
    master(21, 2_000, 28, null),
    master(30, 3_000, 45, K),
    ref(30, 3_000, K, "w0", 45),
  ];
  const records = [
    answer("c0@c1", "allocate", K, 28, 0),
    answer("c0@c1", "get", K, 28, 6_000),
    answer("w0@1", "allocate", K, 45, 3_000),
    answer("w0@1", "get", K, 45, 5_500),
  ];
  const faults: FaultRecord[] = [
    { kind: "kill-follower", label: "kill etcd follower", start: T, end: T + 900, detail: "" },
  ];
  const s = classify(records, store, { faults });
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  const cilium = a.sides.find((x) => x.side === "cilium")!;
  assert.equal(cilium.unjustified?.reason, "unreferenced");
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
  assert.deepEqual(a.master?.writer, { node: "w0", how: "same transaction", side: "idalloc" });
  assert.deepEqual(a.master?.contradicted, [], "nothing live contradicted idalloc's write");
  assert.deepEqual(a.agreedWith, []);
  assert.equal(a.reassigned, undefined);
  assert.equal(a.sinceFault?.label, "kill etcd follower");
  assert.equal(a.sinceFault?.ms, 3_005 - 900);
  assert.match(a.line, /no reassigned event/);
});

/**
 * w3 held K → 33; its reference vanished at 3 s, GC deleted 33, and Cilium's c0 got K2 → 33 at 4 s
 * (master, then its reference).
 */
const TAKEN: StoreChange[] = [
  master(10, 0, 33, K),
  ref(10, 0, K, "w3", 33),
  ref(15, 3_000, K, "w3", null),
  master(16, 3_600, 33, null),
  master(20, 4_000, 33, K2),
  ref(21, 4_010, K2, "c0", 33),
];

/** w3 stopped from 1 s to 9 s. */
const W3_STOPPED = [{ inc: "w3@4", from: T + 1_000, to: T + 9_000 }];

Deno.test("attribution: idalloc answering an ID whose master names another key is idalloc's (taken)", () => {
  // w3 answered K → 33 for seconds after c0 got it (no stall to excuse it).
  const records = [
    answer("w3@4", "allocate", K, 33, 0),
    answer("w3@4", "get", K, 33, 7_000),
    answer("c0@c1", "allocate", K2, 33, 4_000),
    answer("c0@c1", "get", K2, 33, 8_000),
    { t: "reassigned", node: "w3", inc: "w3@4", key: K, oldId: 33, newId: 40, at: T + 7_500 },
  ] satisfies LogRecord[];
  const s = classify(records, TAKEN);
  assert.equal(s.counts["mixed (idalloc's)"], 1);
  const [a] = s.attributions;
  const idalloc = a.sides.find((x) => x.side === "idalloc")!;
  assert.equal(idalloc.unjustified?.reason, "taken");
  assert.deepEqual(a.reassigned, { oldId: 33, newId: 40, ms: 7_500 - 4_005 });
  assert.deepEqual(a.master?.writer, { node: "c0", how: "next reference", side: "cilium" });
});

Deno.test("attribution: across a stall, a hold that ended while idalloc was stopped is Cilium's hole", () => {
  // w3 holds K → 33 and is stopped; meanwhile its reference lapses, GC deletes 33 and Cilium's c0
  // gets K2 → 33, answers it, and its hold ends (its reference is deleted, GC deletes 33 again)
  // before w3 resumes; w3, re-checked, claims 33 back for K. A history that does not end runs at
  // stops (as in the run that could not tell) sees w3's hold across c0's; the store's record
  // shows c0's reference ended while w3 was stopped.
  const store = [
    ...TAKEN,
    ref(25, 6_000, K2, "c0", null),
    master(26, 7_000, 33, null),
    master(30, 9_100, 33, K),
    ref(30, 9_100, K, "w3", 33),
  ];
  const stops = W3_STOPPED;
  const records = [
    answer("w3@4", "allocate", K, 33, 0),
    answer("w3@4", "get", K, 33, 500),
    answer("c0@c1", "allocate", K2, 33, 4_000),
    answer("c0@c1", "get", K2, 33, 5_900),
    answer("w3@4", "get", K, 33, 9_200),
    answer("w3@4", "get", K, 33, 9_500),
  ];
  assert.equal(checkHistory(records, { stops }).overlaps.length, 0, "the stall ends the run");
  const s = attribute(checkHistory(records).overlaps, input(store, records, { stops }));
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  const idalloc = a.sides.find((x) => x.side === "idalloc")!;
  const cilium = a.sides.find((x) => x.side === "cilium")!;
  assert.equal(idalloc.unjustified, undefined, "stopped the whole time c0 held 33");
  assert.deepEqual(idalloc.lastStop, stops[0]);
  assert.deepEqual(cilium.reference, { from: T + 4_010, to: T + 6_000, lease: "7" });
  assert.ok(cilium.reference!.to! < stops[0].to, "c0's hold ended while w3 was stopped");
  assert.match(a.line, /Cilium's reference ended [\d:.]+, while it was stopped/);
});

Deno.test("attribution: idalloc answering a taken ID right after a stall is idalloc's", () => {
  // As above, but c0 still holds K2 → 33 when w3 resumes, and w3 answers K → 33 at once: its
  // re-check after the resume must have read master 33 naming K2.
  const store = TAKEN;
  const stops = W3_STOPPED;
  const records = [
    answer("w3@4", "allocate", K, 33, 0),
    answer("c0@c1", "allocate", K2, 33, 4_000),
    answer("c0@c1", "get", K2, 33, 9_900),
    answer("w3@4", "get", K, 33, 9_050),
    answer("w3@4", "get", K, 33, 9_300),
  ];
  const h = checkHistory(records, { stops });
  assert.equal(h.overlaps.length, 1, "w3's answers after the resume overlap c0's hold");
  const s = attribute(h.overlaps, input(store, records, { stops }));
  assert.equal(s.counts["mixed (idalloc's)"], 1);
  const idalloc = s.attributions[0].sides.find((x) => x.side === "idalloc")!;
  assert.equal(idalloc.unjustified?.reason, "taken");
  assert.match(
    s.attributions[0].line,
    /Cilium's reference \(from [\d:.]+\) lasted past the resume/,
  );
});

Deno.test("attribution: idalloc keeping a key's old ID after a newer referenced master is idalloc's", () => {
  // Cilium's UpdateKey re-creates master 71 for K (newer than 73) with c0's reference; idalloc's
  // w2 holds 73 and never moves, while c0 answers 71.
  const store = [
    master(10, 0, 73, K),
    ref(10, 0, K, "w2", 73),
    master(20, 1_000, 71, K),
    ref(21, 1_005, K, "c0", 71),
  ];
  const records = [
    answer("w2@3", "allocate", K, 73, 0),
    answer("w2@3", "get", K, 73, 5_000),
    answer("c0@c1", "allocate", K, 71, 1_000),
    answer("c0@c1", "get", K, 71, 4_000),
  ];
  const s = classify(records, store);
  assert.equal(s.counts["mixed (idalloc's)"], 1);
  const [a] = s.attributions;
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified?.reason, "superseded");
  assert.equal(a.master?.id, 71);
  assert.equal(a.master?.writer?.side, "cilium");
});

Deno.test("attribution: idalloc on the newest master, agreeing with one Cilium node, inherits the split", () => {
  // c0 holds K → 71 (old master); c1 and w2 are on 73, the newer master: Cilium's own lookup
  // answers 73, and c0 never moves.
  const store = [
    master(10, 0, 71, K),
    ref(11, 0, K, "c0", 71),
    master(20, 500, 73, K),
    ref(21, 505, K, "c1", 73),
    ref(30, 900, K, "w2", 73),
  ];
  const records = [
    answer("c0@c1", "allocate", K, 71, 0),
    answer("c0@c1", "get", K, 71, 5_000),
    answer("c1@c2", "allocate", K, 73, 500),
    answer("c1@c2", "get", K, 73, 4_500),
    answer("w2@3", "allocate", K, 73, 900),
    answer("w2@3", "get", K, 73, 4_000),
  ];
  const s = classify(records, store);
  assert.equal(s.counts["Cilium-only"], 1, "c0 against c1");
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1, "w2 against c0");
  const mixed = s.attributions.find((a) => a.class !== "Cilium-only")!;
  // c1's answers fall outside the conflict; its reference spans it.
  assert.deepEqual(mixed.agreedWith, ["c1 (reference)"]);
  assert.equal(mixed.sides.find((x) => x.side === "cilium")!.unjustified?.reason, "superseded");
  assert.equal(mixed.reassigned, undefined);
  assert.match(mixed.line, /idalloc agreed with c1/);
});

Deno.test("attribution: an idalloc write of a second master beside a live reference is idalloc's", () => {
  // c0 holds K → 71 with a live reference; w0 writes a new master 75 for K anyway.
  const store = [
    master(10, 0, 71, K),
    ref(11, 0, K, "c0", 71),
    master(20, 500, 75, K),
    ref(20, 500, K, "w0", 75),
  ];
  const records = [
    answer("c0@c1", "allocate", K, 71, 0),
    answer("c0@c1", "get", K, 71, 3_000),
    answer("w0@1", "allocate", K, 75, 500),
    answer("w0@1", "get", K, 75, 2_500),
  ];
  const s = classify(records, store);
  assert.equal(s.counts["mixed (idalloc's)"], 1);
  assert.deepEqual(s.attributions[0].master?.contradicted, [`${K}@c0 → 71`]);
});

Deno.test("attribution: SplitKeyError refusals are counted per key with their span", () => {
  const failed = (key: string, start: number): LogRecord => ({
    t: "call",
    node: "w0",
    inc: "w0@1",
    op: "allocate",
    key,
    start: T + start,
    end: T + start + 3,
    ok: false,
    held: false,
    error: "SplitKeyError",
    message: "split",
    typed: true,
    retryable: false,
    deadline: false,
  });
  const r = splitRefusals([failed(K, 0), failed(K, 900), failed(K2, 100)]);
  assert.deepEqual({ calls: r.calls, keys: r.keys, longestMs: r.longestMs }, {
    calls: 3,
    keys: 2,
    longestMs: 903,
  });
});

Deno.test("store history: the writer of a Cilium master is its next reference, not a later one", () => {
  const h = new StoreHistory([
    master(5, 0, 9, K),
    ref(6, 10, K, "c1", 9),
    ref(9, 5_000, K, "w0", 9),
  ]);
  const m = h.masterAt(9, T + 100)!;
  assert.deepEqual(h.writerOf(m), { node: "c1", how: "next reference" });
  const lone = new StoreHistory([master(5, 0, 9, K), ref(9, 5_000, K, "w0", 9)]);
  assert.equal(lone.writerOf(lone.masterAt(9, T + 100)!), undefined, "too late to be its writer");
});

const CHECKS = {
  oneLiveId: "one live ID per key",
  oneKey: "one key per ID",
  holds: "every held key has its master and reference",
  probe: "every key still allocatable",
};

Deno.test("attribution: the store at the end of the run, by whose references split a key", () => {
  // Masters 71 (older) and 73 (newer) of K, as the run ends.
  const store = [master(10, 0, 71, K), master(20, 500, 73, K)];
  const split = (refs: Array<[string, number]>): Violation => ({
    check: CHECKS.oneLiveId,
    message: `key ${K} has live references to IDs 71, 73`,
    evidence: { key: K, refs: refs.map(([node, id]) => ({ key: K, node, id, live: true })) },
  });
  const s = attribute([
    split([["c0", 71], ["c1", 73]]),
    split([["c0", 71], ["c1", 73], ["w0", 73]]),
    split([["c0", 71], ["c1", 73], ["w0", 71]]),
    split([["w0", 71], ["w1", 73]]),
    {
      check: CHECKS.oneKey,
      message: "live reference of c1 names ID 42, whose master names another key",
      evidence: { reference: { key: K, node: "c1", id: 42, live: true } },
    },
    { check: CHECKS.holds, message: "w0 holds K → 71; its reference is gone" },
  ], input(store, [], { checks: CHECKS }));
  assert.deepEqual(s.attributions.map((a) => a.class), [
    "Cilium-only",
    "mixed (inherited from Cilium)",
    "mixed (idalloc's)",
    "idalloc-only",
    "Cilium-only",
    "idalloc-only",
  ]);
  assert.match(s.attributions[2].line, /not on 73, the key's newest referenced master/);
});

/** The probe's failed allocate of `key` (10 s into the run), as its log records it. */
function probeFailure(key: string, error: string, extra: Partial<CallFailed> = {}): CallFailed {
  return {
    t: "call",
    node: "probe",
    inc: "probe@probe",
    op: "allocate",
    key,
    start: T + 10_000,
    end: T + 10_050,
    ok: false,
    held: false,
    error,
    message: "",
    typed: false,
    retryable: false,
    deadline: false,
    ...extra,
  };
}

Deno.test("attribution: a probe stuck on Cilium's stale mutex is inherited, other failures are idalloc's", () => {
  const failed = (key: string, error: string): Violation => ({
    check: CHECKS.probe,
    message: `probe could not allocate ${key}: ${error}`,
    evidence: { record: probeFailure(key, error, { end: T + 20_000, deadline: true }) },
  });
  // A Cilium node's mutex of K, taken before an outage and never unlocked (its lock lease lives).
  const store: StoreChange[] = [
    { t: "lock", rev: 5, at: T + 1_000, of: K, lease: "694d", held: true },
    { t: "lock", rev: 6, at: T + 1_000, of: K2, lease: "694e", held: true },
    { t: "lock", rev: 7, at: T + 12_000, of: K2, lease: "694e", held: false },
  ];
  const s = attribute(
    [failed(K, "TimeoutError"), failed(K2, "TimeoutError")],
    input(store, [], { checks: CHECKS }),
  );
  assert.deepEqual(s.attributions.map((a) => a.class), [
    "mixed (inherited from Cilium)",
    "idalloc-only",
  ]);
  assert.match(
    s.attributions[0].line,
    /mutex of the key was held through the call \(lock lease 694d/,
  );
});

Deno.test("attribution: an InvalidIdError on a key whose only identity a Cilium node wrote outside the range is inherited", () => {
  // Seed 3 of the mixed Kubernetes runs (again on the fixed code): c1 wrote identity 46559 of K,
  // outside idalloc's range [256, 575]; the probe's allocate of K was refused (InvalidIdError: the
  // key gets no other ID), which the call check alone charged to idalloc.
  const refused = (key: string): Violation => ({
    check: ERROR_CHECK,
    message: `probe (probe@probe) allocate ${key} failed with non-retryable typed InvalidIdError`,
    evidence: probeFailure(key, "InvalidIdError", {
      message: `ID 46559 of key '${key}' in the store is outside this allocator's range`,
      typed: true,
    }),
  });
  const store = [
    master(5, 0, 46559, K),
    ref(6, 100, K, "c1", 46559),
    master(7, 0, 46560, K2),
    ref(8, 100, K2, "w0", 46560),
  ];
  const s = attribute(
    [refused(K), refused(K2)],
    input(store, [], { checks: { ...CHECKS, errors: ERROR_CHECK } }),
  );
  assert.deepEqual(s.attributions.map((a) => a.class), [
    "mixed (inherited from Cilium)",
    "idalloc-only",
  ]);
  assert.match(s.attributions[0].line, /identities 46559 were written by Cilium node\(s\) c1/);
});

Deno.test("attribution: an InvalidIdError on a key whose identities lie outside the range, writer unseen, is inherited", () => {
  // The 30-minute run, seed 42: identity 11938 of K appeared with no answer or reference of any
  // node near its creation (its Cilium writer killed at once); K2's out-of-range identity has an
  // idalloc node's reference in its creating revision, so that one stays idalloc's.
  const refused = (key: string, id: number): Violation => ({
    check: ERROR_CHECK,
    message: `w3 (w3@4) allocate ${key} failed with non-retryable typed InvalidIdError`,
    evidence: probeFailure(key, "InvalidIdError", {
      message: `ID ${id} of key '${key}' in the store is outside this allocator's range [256, 575]`,
      typed: true,
    }),
  });
  const store = [master(5, 0, 11938, K), master(7, 0, 46560, K2), ref(7, 0, K2, "w0", 46560)];
  const s = attribute(
    [refused(K, 11938), refused(K2, 46560)],
    input(store, [], { checks: { ...CHECKS, errors: ERROR_CHECK } }),
  );
  assert.deepEqual(s.attributions.map((a) => a.class), [
    "mixed (inherited from Cilium)",
    "idalloc-only",
  ]);
  assert.match(s.attributions[0].line, /11938 lie outside idalloc's range \[256, 575\]/);
});

Deno.test("attribution: two idalloc nodes moving off a split Cilium's UpdateKey made is inherited", () => {
  // w0 holds K → 58; Cilium's c1 re-creates master 57 of K beside w0's live reference (master-key
  // protection); w1 joins 57 (the newest), w0 moves there 400 ms later, within its watch's delay.
  const store = [
    master(10, 0, 58, K),
    ref(10, 0, K, "w0", 58),
    master(20, 1_000, 57, K),
    ref(21, 1_005, K, "c1", 57),
    ref(22, 1_020, K, "w1", 57),
    ref(30, 1_400, K, "w0", 57),
  ];
  const records = [
    answer("w0@1", "allocate", K, 58, 0),
    answer("w0@1", "get", K, 58, 1_300),
    answer("w1@2", "allocate", K, 57, 1_010),
    answer("w1@2", "get", K, 57, 2_000),
  ];
  const s = classify(records, store);
  assert.deepEqual(s.counts["idalloc-only"], 0);
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  assert.match(s.attributions[0].line, /Cilium's write \(c1\) made master 57/);
  // Had idalloc's w1 written the second master itself, beside w0's live reference, it would be
  // idalloc's own.
  const ours = classify(records, [
    master(10, 0, 58, K),
    ref(10, 0, K, "w0", 58),
    master(22, 1_005, 57, K),
    ref(22, 1_005, K, "w1", 57),
    ref(30, 1_400, K, "w0", 57),
  ]);
  assert.equal(ours.counts["idalloc-only"], 1);
});

Deno.test("attribution: a single answer is judged at the last instant of its window", () => {
  // w0's allocate of K ran from 8 s to 10 s: master 3 named K2 until 9.9 s, when GC deleted it and
  // w0 wrote master 3 for K (its answer came after). c0 answered K2 → 3 all along.
  const store = [
    master(10, 0, 3, K2),
    ref(11, 0, K2, "c0", 3),
    ref(12, 500, K2, "c0", null),
    master(20, 9_900, 3, null),
    master(21, 9_950, 3, K),
    ref(21, 9_950, K, "w0", 3),
  ];
  const records = [
    answer("c0@c1", "allocate", K2, 3, 0),
    answer("c0@c1", "get", K2, 3, 12_000),
    answer("w0@1", "allocate", K, 3, 8_000, 10_000),
  ];
  const s = classify(records, store);
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
  // c0 answered from memory: its reference went at 0.5 s.
  assert.equal(a.sides.find((x) => x.side === "cilium")!.unjustified?.reason, "unreferenced");
});

Deno.test("attribution: a reference the recorder saw late, in a replayed batch, may have been there", () => {
  // w0 answered K → 50 at 9.6 s; its reference arrived in the record at 10 s in one batch with
  // others, replayed by the recorder's watch after an etcd outage: it may have been written right
  // after the batch before (3.5 s).
  const before = [
    master(10, 0, 50, K),
    ref(11, 0, K, "c0", 50),
    ref(12, 1_000, K, "w0", 50),
    ref(13, 2_000, K, "w0", null),
    ref(14, 3_000, K, "c0", null),
    master(20, 3_500, 51, K2),
    ref(21, 3_500, K2, "c1", 51),
  ];
  const records = [
    answer("w0@1", "allocate", K, 50, 1_000),
    answer("w0@1", "get", K, 50, 9_600),
    answer("c1@c2", "allocate", K2, 50, 8_000),
    answer("c1@c2", "get", K2, 50, 9_800),
  ];
  const late = classify(records, [
    ...before,
    master(25, 10_000, 60, "k8s:app=other;"),
    ref(30, 10_000, K, "w0", 50),
  ]);
  assert.equal(late.counts["mixed (idalloc's)"], 0);
  assert.equal(late.counts["mixed (inherited from Cilium)"], 1);
  // Recorded promptly (a change of its own at 9.7 s came just before it), the same reference
  // says w0 answered for 7.6 s with no reference of its own.
  const prompt = classify(records, [
    ...before,
    master(25, 9_700, 60, "k8s:app=other;"),
    ref(30, 10_000, K, "w0", 50),
  ]);
  assert.equal(
    prompt.attributions[0].sides.find((x) => x.side === "idalloc")!.unjustified?.reason,
    "unreferenced",
  );
});

Deno.test("attribution: masters left by the drain under a stale Cilium mutex are inherited", () => {
  const drain = (until: number): Violation => ({
    check: "drain",
    message: "1 master(s) of released keys still stored",
    evidence: { left: [{ id: 56, key: K }], waitedMs: 21_000, refs: [], until: T + until },
  });
  const store: StoreChange[] = [{
    t: "lock",
    rev: 5,
    at: T + 1_000,
    of: K,
    lease: "fa22",
    held: true,
  }];
  const checks = { ...CHECKS, drain: "drain" };
  const held = attribute([drain(30_000)], input(store, [], { checks }));
  assert.equal(held.attributions[0].class, "mixed (inherited from Cilium)");
  const free = attribute([drain(500)], input(store, [], { checks }));
  assert.equal(free.attributions[0].class, "idalloc-only");
});

Deno.test("attribution: beside CRD-mode nodes the oldest master is the key's, so staying on it is justified", () => {
  // A Cilium CRD-mode node (no lock) created 71 for K after idalloc's 73: Cilium's own lookup
  // gives K its oldest identity (73), which idalloc keeps; the kvstore rule (newest) would call
  // idalloc's answer superseded.
  const store = [
    master(10, 0, 73, K),
    ref(10, 0, K, "w2", 73),
    master(20, 1_000, 71, K),
    ref(21, 1_005, K, "c0", 71),
  ];
  const records = [
    answer("w2@3", "allocate", K, 73, 0),
    answer("w2@3", "get", K, 73, 5_000),
    answer("c0@c1", "allocate", K, 71, 1_000),
    answer("c0@c1", "get", K, 71, 4_000),
  ];
  const crd = classify(records, store, { keyLookup: "oldest" });
  assert.equal(crd.counts["mixed (inherited from Cilium)"], 1);
  const [a] = crd.attributions;
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
  assert.equal(a.sides.find((x) => x.side === "cilium")!.unjustified?.reason, "superseded");
  assert.equal(classify(records, store).counts["mixed (idalloc's)"], 1, "the kvstore rule");
});

Deno.test("attribution: beside CRD-mode nodes idalloc moving to a newer duplicate is idalloc's", () => {
  // Cilium's c0 holds K → 71 (the oldest, with its endpoint); a newer duplicate 73 appears and
  // idalloc's w2 answers it: not what Cilium's lookup gives K.
  const store = [
    master(10, 0, 71, K),
    ref(11, 5, K, "c0", 71),
    master(20, 1_000, 73, K),
    ref(20, 1_000, K, "w2", 73),
  ];
  const records = [
    answer("c0@c1", "allocate", K, 71, 0),
    answer("c0@c1", "get", K, 71, 5_000),
    answer("w2@3", "allocate", K, 73, 1_000),
    answer("w2@3", "get", K, 73, 4_500),
  ];
  const s = classify(records, store, { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (idalloc's)"], 1);
  const [a] = s.attributions;
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified?.reason, "superseded");
  assert.match(a.line, /older master 71/);
});

/** A master of Kubernetes' record: with its `creationTimestamp` (ms after `T`). */
function identity(rev: number, at: number, id: number, key: string, created: number): StoreChange {
  return { t: "master", rev, at: T + at, id, key, created: T + created };
}

/**
 * Seed 2 of the first mixed Kubernetes runs (`k8s:app=k66;`), as recorded: Cilium's c1 and
 * idalloc's w1 allocate the new key within 24 ms, right after an etcd restart. c1's identity 475
 * commits first; w1, whose watch has not shown it yet, creates 344 with its reference 111 ms
 * later (c1's endpoint naming 475 is already there), sees 475, joins it and drops 344. c1 and c0
 * later take 344 from their own lookups and hold it; w0's lookup answers 475, the oldest.
 */
function racedCreate(
  ciliumRecordedBeforeMs: number,
): { store: StoreChange[]; records: LogRecord[] } {
  const c = ciliumRecordedBeforeMs;
  const store = [
    identity(10, 0, 475, K, -1_000),
    ref(11, c - 2, K, "c1", 475),
    identity(12, c, 344, K, 0),
    ref(12, c, K, "w1", 344),
    ref(13, c + 100, K, "w1", 475),
    ref(14, c + 5_000, K, "w1", null),
    ref(15, c + 5_000, K, "c1", null),
    ref(16, c + 7_000, K, "c1", 344),
  ];
  const records = [
    answer("w1@2", "allocate", K, 475, c - 50, c + 150),
    answer("c1@c2", "allocate", K, 344, c + 7_000),
    answer("c1@c2", "get", K, 344, c + 30_000),
    answer("w0@1", "getNoCache", K, 475, c + 20_000),
  ];
  return { store, records };
}

Deno.test("attribution: beside CRD-mode nodes an idalloc create racing a lock-free Cilium create is not idalloc's", () => {
  const { store, records } = racedCreate(111);
  const s = classify(records, store, { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (idalloc's)"], 0, s.attributions.map((a) => a.line).join("\n"));
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  assert.equal(a.master?.id, 344);
  assert.deepEqual(a.master?.contradicted, [`${K}@c1 → 475`]);
  assert.deepEqual(a.master?.raced, [
    `${K}@c1 → 475, whose identity was recorded 111 ms before`,
  ]);
  assert.match(a.line, /raced a lock-free Cilium create/);
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
});

Deno.test("attribution: beside CRD-mode nodes an idalloc create of a duplicate it could have seen is idalloc's", () => {
  // The same, but Cilium's identity was in the record 3 s before w1's create: its watch had it.
  const { store, records } = racedCreate(3_000);
  const s = classify(records, store, { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (idalloc's)"], 1);
  assert.deepEqual(s.attributions[0].master?.raced, []);
  assert.match(s.attributions[0].line, /idalloc's write \(w1\) made master 344/);
});

Deno.test("attribution: beside CRD-mode nodes the oldest identity is the oldest creationTimestamp, not the first commit", () => {
  // 71 commits first but was admitted a second after 73 (etcd was down: 73's create waited). c0
  // holds 71, idalloc's w2 joined 73: Cilium's lookup and idalloc's give K 73.
  const store = [
    identity(10, 0, 71, K, 1_000),
    ref(11, 5, K, "c0", 71),
    identity(20, 100, 73, K, 0),
    ref(21, 150, K, "c1", 73),
    ref(30, 2_000, K, "w2", 73),
  ];
  const records = [
    answer("c0@c1", "allocate", K, 71, 0),
    answer("c0@c1", "get", K, 71, 6_000),
    answer("w2@3", "allocate", K, 73, 2_000),
    answer("w2@3", "get", K, 73, 5_000),
  ];
  const s = classify(records, store, { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
  assert.equal(a.sides.find((x) => x.side === "cilium")!.unjustified?.reason, "superseded");
  // Without creation times, the commit order stands in: then w2 would be the one off the oldest.
  const byRev = store.map((c) => c.t === "master" ? { ...c, created: undefined } : c);
  assert.equal(classify(records, byRev, { keyLookup: "oldest" }).counts["mixed (idalloc's)"], 1);
});

Deno.test("attribution: on an exact creation-time tie a Cilium answer of either ID is justified, idalloc's of the lower", () => {
  // 71 and 73 created in the same second: idalloc's rule gives K 71 (the lower ID); Cilium's
  // unstable sort may give either.
  const store = [
    identity(10, 0, 71, K, 0),
    ref(11, 5, K, "w2", 71),
    identity(20, 100, 73, K, 0),
    ref(21, 150, K, "c0", 73),
  ];
  const records = [
    answer("w2@3", "allocate", K, 71, 0),
    answer("w2@3", "get", K, 71, 5_000),
    answer("c0@c1", "allocate", K, 73, 100),
    answer("c0@c1", "get", K, 73, 5_000),
  ];
  const s = classify(records, store, { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  assert.equal(a.sides.find((x) => x.side === "cilium")!.unjustified, undefined);
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
});

/**
 * Seed 7 of the mixed Kubernetes runs (`k8s:app=k19;`): the record merges several watches, each
 * in its own order. w1 joined 398 (the key's oldest) at 12 s and its reference arrived at once;
 * an endpoint of a lower revision, from the endpoints' watch lagging after an API-server restart,
 * arrived 8 s later. Dated by that late arrival, w1's reference read as written after its
 * answers: "no live reference of its own" since its earlier one ended at 2.1 s.
 */
function lateOtherWatch(lateAt: number): StoreChange[] {
  return [
    identity(10, 0, 398, K, 0),
    ref(11, 10, K, "c0", 398),
    identity(12, 20, 508, K, 1_000),
    ref(13, 1_000, K, "c1", 508),
    ref(14, 2_000, K, "w1", 398),
    ref(15, 2_100, K, "w1", null),
    ref(28, 11_000, K2, "w3", 77),
    ref(29, lateAt, K2, "c0", 78),
    ref(30, 12_000, K, "w1", 398),
    ref(31, 14_500, K, "w1", null),
  ];
}

const LATE_RECORDS = [
  answer("c1@c2", "allocate", K, 508, 1_000),
  answer("c1@c2", "get", K, 508, 15_000),
  answer("w1@2", "allocate", K, 398, 11_900, 12_050),
  answer("w1@2", "get", K, 398, 14_000),
];

Deno.test("attribution: a reference is not dated by a lower revision another watch delivered late", () => {
  const s = classify(LATE_RECORDS, lateOtherWatch(20_000), { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (idalloc's)"], 0, s.attributions.map((a) => a.line).join("\n"));
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  assert.equal(a.sides.find((x) => x.side === "idalloc")!.unjustified, undefined);
  assert.equal(a.sides.find((x) => x.side === "cilium")!.unjustified?.reason, "superseded");
  const span = new StoreHistory(lateOtherWatch(20_000)).refsOf(K, "w1").find((r) =>
    r.fromRev === 30
  )!;
  // The last arrival of a lower revision before its own (rev 28 at 11 s), never after it.
  assert.deepEqual([span.fromEarly, span.from], [T + 11_000, T + 12_000]);
  // The same record in arrival order (rev 29 prompt, at 11.5 s) dates it as before.
  const prompt = new StoreHistory(lateOtherWatch(11_500)).refsOf(K, "w1").find((r) =>
    r.fromRev === 30
  )!;
  assert.equal(prompt.fromEarly, T + 11_500);
});

/**
 * Seed 7 of the mixed Kubernetes runs (`k8s:app=k137;`): w0 joined 456 (the key's oldest) and
 * answered at 8.6 s with its reference written; the record was blind then (a 410 under every
 * watch, gap records from 9 s), and the reference arrived at 9.75 s in the re-list, after another
 * watch's re-list of lower revisions (9.7 s).
 */
function relisted(gap: StoreChange, wReference: StoreChange = ref(30, 9_750, K, "w0", 456)) {
  const store: StoreChange[] = [
    identity(10, 0, 456, K, 0),
    ref(10, 0, K, "w0", 456),
    ref(11, 1_000, K, "w0", null),
    identity(12, 2_000, 288, K, 1_000),
    ref(13, 2_050, K, "c0", 288),
    ref(20, 7_000, K2, "w3", 77),
    gap,
    ref(25, 9_700, K2, "w2", 78),
    wReference,
  ];
  const records = [
    answer("c0@c1", "allocate", K, 288, 2_000),
    answer("c0@c1", "get", K, 288, 8_610),
    answer("w0@1", "allocate", K, 456, 8_200, 8_600),
    answer("w0@1", "get", K, 456, 8_700),
  ];
  return classify(records, store, { keyLookup: "oldest" });
}

Deno.test("attribution: a reference re-listed after a gap may have been written while the record was blind", () => {
  // A record without the recorder's marks (older runs, etcd): shortly after a gap, the last
  // arrival before the gaps began (7 s) bounds it.
  const old = relisted({ t: "gap", at: T + 9_000, why: "leases: 410" });
  assert.equal(old.counts["mixed (idalloc's)"], 0, old.attributions.map((a) => a.line).join("\n"));
  assert.equal(old.counts["mixed (inherited from Cilium)"], 1);
  // The recorder's mark on the re-listed change (its watch last current at 7.2 s) is the bound.
  const marked = relisted(
    { t: "gap", at: T + 9_000, why: "leases: 410", since: T + 7_200 },
    { ...ref(30, 9_750, K, "w0", 456) as Extract<StoreChange, { t: "ref" }>, early: T + 7_200 },
  );
  assert.equal(marked.counts["mixed (idalloc's)"], 0);
  // A record whose gaps say it marks its re-lists, with no mark on the change: not re-listed.
  // Blind from 8.75 s only, so w0 answered 8.2–8.7 s with no reference (since 1 s): idalloc's.
  const unmarked = relisted({ t: "gap", at: T + 9_000, why: "leases: 410", since: T + 8_750 });
  assert.equal(unmarked.counts["mixed (idalloc's)"], 1);
  assert.equal(
    unmarked.attributions[0].sides.find((x) => x.side === "idalloc")!.unjustified?.reason,
    "unreferenced",
  );
  // Blind from 7.2 s: w0's answers fell inside the blind window, where a reference written and
  // dropped again never reaches the record (the 30-minute run, seed 42): not judged unreferenced.
  const blind = relisted({ t: "gap", at: T + 9_000, why: "leases: 410", since: T + 7_200 });
  assert.equal(
    blind.counts["mixed (idalloc's)"],
    0,
    blind.attributions.map((a) => a.line).join("\n"),
  );
});

Deno.test("attribution: beside CRD-mode nodes an idalloc create of an ID only a stale Cilium endpoint names is not idalloc's", () => {
  // Seed 42's 30-minute run: identity 534 of k192 is deleted; Cilium's c1, whose cache missed the
  // delete, keeps answering k192 → 534 and names it in its endpoint; idalloc's w0 gives the free ID
  // 534 to another key. The store held no identity 534 of k192 when w0 wrote.
  const K2 = "k8s:app=k192;";
  const store: StoreChange[] = [
    identity(10, 0, 534, K2, 0),
    { t: "master", rev: 20, at: T + 1_000, id: 534, key: null },
    ref(21, 1_274, K2, "c1", 534),
    identity(30, 30_000, 534, K, 30_000),
    ref(30, 30_000, K, "w0", 534),
  ];
  const records = [
    answer("c1@c2", "allocate", K2, 534, 1_200),
    answer("c1@c2", "get", K2, 534, 35_000),
    answer("w0@1", "allocate", K, 534, 29_950, 30_010),
    answer("w0@1", "get", K, 534, 36_000),
  ];
  const s = classify(records, store, { keyLookup: "oldest" });
  assert.equal(s.counts["mixed (idalloc's)"], 0, s.attributions.map((a) => a.line).join("\n"));
  assert.equal(s.counts["mixed (inherited from Cilium)"], 1);
  const [a] = s.attributions;
  assert.deepEqual(a.master?.orphaned, [`${K2}@c1 → 534, which had no identity of its key`]);
  assert.match(a.line, /took an ID the store held no identity of/);
});
