/**
 * How etcd's damage report judges one listed entry, on plain data (no etcd). The report itself
 * (holders, removal) runs on a real etcd in garbage.test.ts.
 */
import assert from "node:assert/strict";
import { masterDamage, referenceDamage } from "../../../src/backends/etcd/doctor.ts";
import { EtcdLayout } from "../../../src/backends/etcd/layout.ts";
import { rangeCheck } from "../../../src/allocator/damage.ts";
import { kv } from "./_plain.ts";

const layout = new EtcdLayout("p");

Deno.test("masterDamage: a readable master of a storable key is no damage", () => {
  assert.equal(masterDamage(layout, kv("p/id/7", "k;")), undefined);
});

Deno.test("masterDamage: bad ID, unreadable or empty value, unstorable key", () => {
  const kinds = (key: string, value: string | Uint8Array) => {
    const d = masterDamage(layout, kv(key, value));
    return [d?.kind, d?.about];
  };
  assert.deepEqual(kinds("p/id/x", "k;"), ["master-bad-id", undefined]);
  assert.deepEqual(kinds("p/id/7", new Uint8Array([0xff])), ["master-undecodable", { id: 7 }]);
  assert.deepEqual(kinds("p/id/7", ""), ["master-empty", { id: 7 }]);
  // Go's path cleaning moves `..` out of `value/`.
  assert.deepEqual(kinds("p/id/7", "../x"), ["master-oversized", { id: 7, key: "../x" }]);
  assert.match(masterDamage(layout, kv("p/id/7", "../x"))!.reason, /^its key cannot be stored/);
});

Deno.test("referenceDamage: a leased reference in range is live and no damage", () => {
  const check = rangeCheck({ range: { min: 1, max: 10 } });
  assert.deepEqual(referenceDamage(layout, kv("p/value/k;/a", "7", "5", "77"), check), {
    parts: { key: "k;", node: "a" },
    live: { key: "k;", node: "a", id: 7 },
  });
});

Deno.test("referenceDamage: out of every valid range, it is damage and still live", () => {
  const check = rangeCheck({ range: { min: 1, max: 5 } });
  const verdict = referenceDamage(layout, kv("p/value/k;/a", "7", "5", "77"), check);
  assert.deepEqual(verdict.live, { key: "k;", node: "a", id: 7 });
  assert.equal(verdict.damage?.kind, "reference-out-of-range");
  assert.equal(verdict.damage?.reason, "ID 7 is outside the valid range [1, 5]");
  // Without ranges, no ID is out of range.
  assert.equal(
    referenceDamage(layout, kv("p/value/k;/a", "7", "5", "77"), undefined).damage,
    undefined,
  );
});

Deno.test("referenceDamage: a bad key shape, a non-ID value, no lease", () => {
  assert.deepEqual(referenceDamage(layout, kv("p/value/k;", "7", "5", "77"), undefined), {
    damage: { kind: "reference-bad-key", reason: "not a <key>/<node> reference key" },
  });
  const undecodable = referenceDamage(layout, kv("p/value/k;/a", "x", "5", "77"), undefined);
  assert.deepEqual(undecodable.parts, { key: "k;", node: "a" });
  assert.equal(undecodable.live, undefined);
  assert.equal(undecodable.damage?.kind, "reference-undecodable");
  const unleased = referenceDamage(layout, kv("p/value/k;/a", "7"), undefined);
  assert.equal(unleased.live, undefined);
  assert.deepEqual(unleased.damage, {
    kind: "reference-without-lease",
    reason: "it is bound to no lease",
    about: { key: "k;", node: "a", id: 7 },
  });
});
