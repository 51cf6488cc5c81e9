// The growth bounds must catch what grows with the number of cycles: a change feed that is never
// trimmed, dead references or lease records piling up, a leaking heap.
import assert from "node:assert/strict";
import { checkGrowth } from "../../nemesis/growth.ts";
import type { GrowthSample } from "../../src/testing/nemesis.ts";

const MiB = 1024 * 1024;

function sample(cycles: number, extra: Partial<GrowthSample> = {}): GrowthSample {
  return {
    cycles,
    elapsedMs: cycles,
    rss: 100 * MiB,
    heapUsed: 20 * MiB,
    fileBytes: 4 * MiB,
    counts: { id: 900, key: 900, touch: 900, ref: 50, "ref (dead)": 0, lease: 1, log: 100 },
    recentChanges: 500,
    logWindowMs: 70_000,
    ...extra,
  };
}

Deno.test("growth checks: a steady run passes", () => {
  const samples = [0, 2_000, 4_000, 6_000].map((c) => sample(c));
  assert.deepEqual(checkGrowth("deno-kv", samples), []);
});

Deno.test("growth checks: a change feed beyond its retention window is caught", () => {
  const samples = [
    sample(0),
    sample(2_000),
    sample(4_000, { counts: { ...sample(0).counts, log: 9_000 } }),
  ];
  const messages = checkGrowth("deno-kv", samples).map((v) => v.message);
  assert.deepEqual(messages, [
    "after 4000 cycles: 9000 change-feed entries, but only 500 written in the last 70000 ms",
  ]);
});

Deno.test("growth checks: dead references and lease records piling up are caught", () => {
  const counts = { ...sample(0).counts, "ref (dead)": 400, lease: 7 };
  const messages = checkGrowth("deno-kv", [sample(0), sample(2_000, { counts })]).map((v) =>
    v.message
  );
  assert.deepEqual(messages, [
    "after 2000 cycles: 400 dead references",
    "after 2000 cycles: 7 lease records for one node",
  ]);
  const etcd = checkGrowth("etcd", [sample(0, { counts: { id: 10, value: 10, leases: 5 } })]);
  assert.deepEqual(etcd.map((v) => v.message), ["after 0 cycles: 5 etcd leases for one node"]);
});

Deno.test("growth checks: a heap that keeps growing after warm-up is caught", () => {
  const samples = [
    sample(0),
    sample(2_000),
    sample(4_000, { heapUsed: 40 * MiB }),
    sample(200_000, { heapUsed: 80 * MiB, rss: 400 * MiB }),
  ];
  const messages = checkGrowth("deno-kv", samples).map((v) => v.message);
  assert.equal(messages.length, 2, messages.join("\n"));
  assert.match(messages[0], /^after 200000 cycles: heap 80\.0 MiB, over 33\.0 MiB/);
  assert.match(messages[1], /^after 200000 cycles: RSS 400\.0 MiB, over 198\.0 MiB/);
});
