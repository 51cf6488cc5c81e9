// Many nodes allocating the same keys at once: in one process and in separate processes.
import assert from "node:assert/strict";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { assertStoreInvariants, keys, openNode } from "./_helpers.ts";
import { ChildNode } from "./_processes.ts";

const KEYS = keys(300);

function assertAgreement(maps: Array<Record<string, number>>): void {
  const reference = maps[0];
  assert.equal(Object.keys(reference).length, KEYS.length);
  for (const map of maps.slice(1)) assert.deepEqual(map, reference, "every node sees the same IDs");
  assert.equal(new Set(Object.values(reference)).size, KEYS.length, "IDs are unique");
}

testEachBackendAndMode(
  "4 allocators in one process allocate the same 300 keys at once",
  async (f) => {
    await using fx = await f.create();
    const nodes = await Promise.all(
      // Leases long enough not to lapse on a starved CI machine: this is about agreement, not lapses.
      ["n1", "n2", "n3", "n4"].map((n) =>
        openNode(fx, n, { max: 4096, maxAttempts: 64, leaseTtlMs: 15_000 })
      ),
    );
    try {
      const maps = await Promise.all(nodes.map(async (node) => {
        const results = await Promise.all(KEYS.map((k) => node.allocate(k)));
        return Object.fromEntries(KEYS.map((k, i) => [k, results[i].id]));
      }));
      assertAgreement(maps);
      const stored = await fx.masters();
      assert.equal(stored.size, KEYS.length, "exactly one master per key, none burnt");
      for (const [k, id] of Object.entries(maps[0])) assert.equal(stored.get(id), k);
      const refs = await fx.references();
      assert.equal(refs.length, KEYS.length * nodes.length);
      await assertStoreInvariants(fx);
    } finally {
      await Promise.all(nodes.map((n) => n.close()));
    }
  },
);

testEachBackendAndMode(
  "3 allocators in separate processes allocate the same 300 keys at once",
  async (f) => {
    await using fx = await f.create();
    // Leases long enough not to lapse on a starved machine: a lapse voids a child's earlier answers
    // (another node may then give the key another ID), and this is about agreement, not lapses.
    const children = ["p1", "p2", "p3"].map((n) =>
      new ChildNode(fx.spec(), n, 4096, KEYS.length, { leaseTtlMs: 15_000 })
    );
    try {
      const maps = await Promise.all(children.map((c) => c.ids()));
      await Promise.all(children.map((c) => c.done()));
      assertAgreement(maps);
      const stored = await fx.masters();
      for (const [k, id] of Object.entries(maps[0])) assert.equal(stored.get(id), k);
      await assertStoreInvariants(fx);
      // A fourth node in this process agrees too.
      await using local = await openNode(fx, "p4", { max: 4096 });
      for (const k of KEYS.slice(0, 20)) {
        const r = await local.allocate(k);
        assert.equal(r.id, maps[0][k]);
        assert.equal(r.isNew, false);
      }
    } finally {
      for (const c of children) await c[Symbol.asyncDispose]();
    }
  },
);
