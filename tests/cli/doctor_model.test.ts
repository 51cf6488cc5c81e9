/**
 * `doctor` as model → render, on plain data (no store): what the findings and their outcomes
 * amount to, and every piece of output made from them. The command itself runs against real
 * stores in cli.test.ts, live_holders.test.ts and etcd.test.ts.
 */
import assert from "node:assert/strict";
import type { DamageFinding } from "../../src/allocator/damage.ts";
import { CILIUM_USE } from "../../src/backends/doublewrite/mod.ts";
import {
  doctorJson,
  doctorModel,
  doctorSummary,
  doctorTable,
  fixHint,
  heldWarning,
  type Outcome,
} from "../../src/cli/commands/doctor.ts";

function finding(entry: string, heldBy?: string[]): DamageFinding {
  return {
    kind: "master-undecodable",
    entry,
    reason: "the value is not a key",
    token: `t:${entry}`,
    ...(heldBy ? { heldBy } : {}),
  };
}

const result = (f: DamageFinding, outcome: Outcome) => ({ finding: f, outcome });

Deno.test("doctorModel: outcomes counted, remaining entries, holders sorted once", () => {
  const model = doctorModel([
    result(finding("a"), "removed"),
    result(finding("b", ["n2", "n1"]), "held"),
    result(finding("c", ["n1"]), "held"),
    result(finding("d"), "changed meanwhile"),
  ], true);
  assert.deepEqual(model.count, {
    removed: 1,
    copied: 0,
    "changed meanwhile": 1,
    held: 2,
    kept: 0,
  });
  assert.equal(model.remaining, 3);
  assert.deepEqual(model.holders, ["n1", "n2"]);
});

Deno.test("without --fix: found entries are listed, with the hint to remove them", () => {
  const model = doctorModel([
    result(finding("a"), "kept"),
    result(finding("b"), "kept"),
  ], false);
  assert.equal(doctorSummary(model), "found 2 damaged entries");
  assert.deepEqual(doctorTable(model), {
    header: ["KIND", "REASON", "ENTRY"],
    rows: [
      ["master-undecodable", "the value is not a key", "a"],
      ["master-undecodable", "the value is not a key", "b"],
    ],
  });
  assert.deepEqual(doctorJson(model), [finding("a"), finding("b")]);
  assert.equal(heldWarning(model), undefined);
  assert.equal(fixHint(model), "run 'idalloc doctor --fix' to delete these 2 entries");
  assert.equal(model.remaining, 2);
});

Deno.test("with held entries: a holders column, the warning, and a hint that leaves them out", () => {
  const model = doctorModel([
    result(finding("a"), "kept"),
    result(finding("b", ["n1"]), "held"),
  ], false);
  assert.equal(doctorSummary(model), "found 2 damaged entries (1 held by live nodes)");
  assert.deepEqual(doctorTable(model).header, ["KIND", "REASON", "HELD BY", "ENTRY"]);
  assert.deepEqual(doctorTable(model).rows.map((r) => r[2]), ["-", "n1"]);
  assert.match(heldWarning(model)!, /^1 entry is held by live node n1, so doctor leaves it: /);
  assert.match(heldWarning(model)!, /Stop it \(references go with their lease\)/);
  assert.equal(
    fixHint(model),
    "run 'idalloc doctor --fix' to delete this entry (not the held one)",
  );
});

Deno.test("with --fix: an outcome column and in the JSON, no hint; removed entries are gone", () => {
  const model = doctorModel([
    result(finding("a"), "removed"),
    result(finding("b"), "changed meanwhile"),
  ], true);
  assert.equal(doctorSummary(model), "found 2 damaged entries, removed 1");
  assert.deepEqual(doctorTable(model).header, ["KIND", "OUTCOME", "REASON", "ENTRY"]);
  assert.deepEqual(doctorTable(model).rows.map((r) => r[1]), ["removed", "changed meanwhile"]);
  assert.deepEqual(doctorJson(model), [
    { ...finding("a"), outcome: "removed" },
    { ...finding("b"), outcome: "changed meanwhile" },
  ]);
  assert.equal(fixHint(model), undefined);
  assert.equal(model.remaining, 1);
});

Deno.test("nothing found: nothing remains", () => {
  const model = doctorModel([], true);
  assert.equal(doctorSummary(model), "found 0 damaged entries, removed 0");
  assert.equal(model.remaining, 0);
});

Deno.test("double-write drift: copied findings are gone, the hint says repair, Cilium holds", () => {
  const drift = (entry: string, heldBy?: string[]): DamageFinding => ({
    ...finding(entry, heldBy),
    kind: "kvstore-only",
  });
  const fixed = doctorModel([
    result(drift("a"), "copied"),
    result(finding("b"), "removed"),
    result(drift("c"), "changed meanwhile"),
  ], true);
  assert.equal(doctorSummary(fixed), "found 3 damaged entries, removed 1, copied 1 across");
  assert.equal(fixed.remaining, 1);
  const listed = doctorModel([
    result(drift("a"), "kept"),
    result({ ...drift("b", [CILIUM_USE]), kind: "labels-differ" }, "held"),
  ], false);
  assert.equal(
    fixHint(listed),
    "run 'idalloc doctor --fix' to repair this entry (not the held one)",
  );
  assert.match(heldWarning(listed)!, /in use by Cilium \(see HELD BY\)/);
});
