/**
 * `status` as model → render, on plain data (no store): what a reading of the store amounts to,
 * and the table it prints. The command itself runs against real stores in cli.test.ts and
 * etcd.test.ts.
 */
import assert from "node:assert/strict";
import { statusModel, type StatusReading, statusRows } from "../../src/cli/commands/status.ts";

const NOW = Date.parse("2030-01-01T00:00:00.000Z");
const range = { min: 1, max: 10 };

function reading(partial: Partial<StatusReading> = {}): StatusReading {
  return {
    where: "kv.db",
    backend: "deno-kv",
    prefix: "ids",
    latencyMs: 1.5,
    health: { backend: "deno-kv", node: "cli", endpoints: ["kv.db"], leases: 0, healthy: true },
    ids: [[1, "a;"], [2, "b;"], [3, "c;"]],
    references: [
      { key: "a;", node: "n1", id: 1, live: true },
      { key: "a;", node: "n2", id: 1, live: true },
      { key: "b;", node: "n2", id: 2, live: false },
    ],
    leases: [
      { node: "n1", live: true, expiresAt: NOW + 12_000 },
      { node: "n2", live: false, expiresAt: NOW - 3_000 },
      { node: "n3", live: true },
    ],
    ...partial,
  };
}

Deno.test("statusModel: counts, usage, node leases and metrics from one reading", () => {
  const model = statusModel(reading(), range);
  assert.deepEqual(model, {
    store: "kv.db",
    backend: "deno-kv",
    prefix: "ids",
    reachable: true,
    healthy: true,
    latencyMs: 1.5,
    leader: null,
    lastError: null,
    ids: 3,
    minId: 1,
    maxId: 3,
    nodes: [
      { node: "n1", live: true, expiresAt: "2030-01-01T00:00:12.000Z" },
      { node: "n2", live: false, expiresAt: "2029-12-31T23:59:57.000Z" },
      { node: "n3", live: true, expiresAt: null },
    ],
    references: { total: 3, live: 2 },
    // Only a.; has live references: b;'s is dead, c; has none.
    usage: { inUse: 1, unused: 2 },
    splitKeys: [],
    metrics: {
      "idalloc.ids.free": 7,
      "idalloc.keys.held": { n1: 1, n2: 1 },
      "idalloc.healthy": 1,
      "idalloc.store.operation.duration": 0.0015,
    },
  });
});

Deno.test("statusModel: an empty store has no IDs, no bounds, every ID free", () => {
  const model = statusModel(reading({ ids: [], references: [], leases: [] }), range);
  assert.deepEqual([model.ids, model.minId, model.maxId], [0, null, null]);
  assert.equal(model.metrics["idalloc.ids.free"], 10);
});

Deno.test("statusModel: a key whose live references name different IDs is split", () => {
  const references = [
    { key: "a;", node: "n1", id: 1, live: true },
    { key: "a;", node: "n2", id: 2, live: true },
  ];
  assert.deepEqual(statusModel(reading({ references }), range).splitKeys, [
    { key: "a;", ids: [1, 2], references: [{ node: "n1", id: 1 }, { node: "n2", id: 2 }] },
  ]);
});

Deno.test("statusRows: the table, with lease ends relative to now", () => {
  const health = {
    ...reading().health,
    healthy: false,
    leader: "http://e1",
    lastError: "watch failed",
  };
  const rows = statusRows(statusModel(reading({ health }), range), range, NOW);
  assert.deepEqual(rows, [
    ["store", "kv.db"],
    ["prefix", "ids"],
    ["reachable", "yes, one read took 1.5 ms (unhealthy); last error: watch failed"],
    ["leader", "http://e1"],
    ["IDs", "3 (from 1 to 3)"],
    ["nodes", "2 with a live lease, 1 lapsed"],
    ["", "n1: live, lease ends in 12s"],
    ["", "n2: lapsed, lease ends 3s ago"],
    ["", "n3: live"],
    ["references", "2 live, 1 dead"],
    ["usage", "1 in use, 2 unused (GC collects them in two passes)"],
    ["metrics", "idalloc.ids.free 7 (of 10 in 1–10)"],
    ["", "idalloc.keys.held n1 1, n2 1"],
    ["", "idalloc.healthy 0"],
  ]);
});

Deno.test("statusRows: no IDs, nothing held, split keys named with their nodes", () => {
  const references = [
    { key: "a;", node: "n2", id: 2, live: true },
    { key: "a;", node: "n1", id: 1, live: true },
    { key: "a;", node: "n3", id: 1, live: true },
  ];
  const none = statusRows(statusModel(reading({ ids: [], references: [] }), range), range, NOW);
  assert.deepEqual(none.find(([k]) => k === "IDs"), ["IDs", "none"]);
  assert.ok(none.some(([, v]) => v === "idalloc.keys.held 0"));
  const split = statusRows(statusModel(reading({ references }), range), range, NOW);
  assert.deepEqual(split.slice(-2), [
    [
      "split keys",
      "1 key whose live references name different IDs (written by another writer; stop the " +
      "nodes whose references are wrong: their references go with their leases)",
    ],
    ["", "a;: ID 1 (n1, n3) vs ID 2 (n2)"],
  ]);
});
