// The corruption corpus (issue 13): garbage written under the prefix while nodes run never stops
// GC, never changes a key's ID, never escapes the range, and is reported as damage, not as an
// unavailable store. One scenario per item, on every backend it applies to.
import assert from "node:assert/strict";
import {
  type DamageFinding,
  InvalidOptionsError,
  isStoreDoctor,
  type StoreDoctor,
} from "../../mod.ts";
import type { StoreFixture } from "../../src/testing/fixture.ts";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { BACKENDS } from "../../src/backends/registry.ts";
import { assertStoreInvariants, eventually, openNode } from "./_helpers.ts";

/** The fixture's store as a {@linkcode StoreDoctor}, through a backend of its own. */
async function doctorOf(fx: StoreFixture): Promise<StoreDoctor> {
  const backend = await fx.backend("doctor");
  assert.ok(isStoreDoctor(backend), `${fx.kind} backend implements StoreDoctor`);
  return backend;
}

async function findings(doctor: StoreDoctor, max = 1000): Promise<DamageFinding[]> {
  const out: DamageFinding[] = [];
  for await (const f of doctor.findDamage({ range: { min: 1, max } })) out.push(f);
  return out;
}

testEachBackendAndMode(
  "garbage 1: a corrupt gen counter never half-applies a commit; a new key is new and watched",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    await using b = await openNode(fx, "b", { max: 1000 });
    await a.allocate("warm;");
    await fx.corruptCounter!("gen");
    const fresh = await a.allocate("fresh;");
    assert.equal(fresh.isNew, true, "a brand-new key is reported new");
    assert.equal((await fx.masters()).get(fresh.id), "fresh;");
    // Another node's change feed sees it (the counter was repaired, the log entry written).
    await eventually(() => b.cachedId("fresh;") === fresh.id, "b's feed learns the new key");
    // The counter works again for everyone.
    const later = await b.allocate("later;");
    assert.equal(later.isNew, true);
    await eventually(() => a.cachedId("later;") === later.id, "a's feed learns b's key");
    await assertStoreInvariants(fx);
  },
  { applies: (traits) => traits.counters },
);

testEachBackendAndMode(
  "garbage 2: a corrupt touch counter never makes a key impossible to allocate or collect",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    await using b = await openNode(fx, "b", { max: 1000 });
    await fx.corruptCounter!({ touch: "z;" });
    const first = await a.allocate("z;");
    assert.equal(first.isNew, true);
    await fx.corruptCounter!({ touch: "z;" });
    assert.equal((await b.allocate("z;")).id, first.id, "an existing key, too");
    await a.release("z;");
    await b.release("z;");
    await fx.corruptCounter!({ touch: "z;" });
    await a.runGc();
    const stats = await a.runGc();
    assert.deepEqual(stats.deletedIds, [first.id], "GC still collects it");
    await assertStoreInvariants(fx);
  },
  { applies: (traits) => traits.counters },
);

testEachBackendAndMode(
  "garbage 3/5: an oversized master is skipped and counted; GC goes on collecting",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { min: 1, max: 1000 });
    await fx.plantOversizedMaster(5);
    const keep = await a.allocate("keep;");
    const drop = await a.allocate("drop;");
    await a.release("drop;");
    const first = await a.runGc();
    const second = await a.runGc();
    assert.deepEqual(second.deletedIds, [drop.id]);
    const masters = await fx.masters();
    assert.equal(masters.get(keep.id), "keep;");
    assert.ok(masters.has(5), "the oversized master is left for an operator");
    assert.ok(first.skipped >= 1 && second.skipped >= 1, `skipped: ${first.skipped}`);
    // Allocation is not disturbed either, and never picks the taken ID.
    for (let i = 0; i < 20; i++) assert.notEqual((await a.allocate(`more-${i};`)).id, 5);
  },
);

testEachBackendAndMode(
  "garbage 4: a corrupt master of a live key is repaired, never replaced by a second ID",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    const live = await a.allocate("live;");
    await fx.corruptMaster(live.id);
    // A node that never saw the master allocates the key: it joins the live ID.
    await using b = await openNode(fx, "b", { max: 1000 });
    const joined = await b.allocate("live;");
    assert.equal(joined.id, live.id, "no second ID for a key that live references hold");
    assert.equal((await fx.masters()).get(live.id), "live;", "the master is repaired");
    // The holder's own sync repairs it too (master-key protection), once its watch shows the
    // damage: on Kubernetes a sync checks held keys in the informer and reads none that look fine.
    await fx.corruptMaster(live.id);
    await eventually(async () => {
      await a.sync();
      return (await fx.masters()).get(live.id) === "live;";
    }, "the holder repaired it");
    await assertStoreInvariants(fx);
  },
);

testEachBackendAndMode(
  "damage report: lists the garbage, removes it only if unchanged, then the store is clean",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 1000 });
    const held = await a.allocate("held;");
    await fx.plantCorruptEntries();
    await fx.plantOversizedMaster(5);
    await fx.corruptMaster(6);
    await fx.corruptCounter?.("gen");
    const doctor = await doctorOf(fx);
    const found = await findings(doctor);
    const kinds = new Set(found.map((x) => x.kind));
    for (
      const kind of [
        "master-bad-id",
        "master-undecodable",
        "master-oversized",
        "reference-undecodable",
      ] as const
    ) {
      assert.ok(kinds.has(kind), `${kind} reported: ${[...kinds]}`);
    }
    for (const kind of f.traits.plantedDamageKinds) {
      assert.ok(kinds.has(kind), `${kind} reported: ${[...kinds]}`);
    }
    assert.ok(!found.some((x) => x.id === held.id), "nothing of a healthy key is reported");
    const oversized = found.find((x) => x.kind === "master-oversized" && x.id === 5)!;
    assert.ok(oversized.entry.length < 400, "a huge entry is shown shortened");
    // Changed since listed: kept.
    await fx.corruptMaster(5);
    assert.equal(await doctor.removeDamage(oversized), false);
    assert.ok((await fx.masters()).has(5) || (await findings(doctor)).some((x) => x.id === 5));
    // Forged and foreign tokens are refused.
    await assert.rejects(doctor.removeDamage({ token: "nonsense" }), InvalidOptionsError);
    const foreign = `${BACKENDS.find((b) => b.kind !== fx.kind)!.kind}:e30`;
    await assert.rejects(doctor.removeDamage({ token: foreign }), InvalidOptionsError);
    // A fresh listing, removed entry by entry, leaves a clean store with its live key intact.
    const kept: string[] = [];
    for (const finding of await findings(doctor)) {
      if (!await doctor.removeDamage(finding)) kept.push(finding.entry);
    }
    // Deno KV: removing a master writes its change-feed entry, which repairs `gen` first; the
    // repaired counter is no longer the listed entry, so its removal is refused.
    assert.deepEqual(kept, f.traits.repairedByRemoval);
    assert.deepEqual(await findings(doctor), []);
    assert.equal((await fx.masters()).get(held.id), "held;");
    assert.equal((await a.allocate("after;")).isNew, true);
    await assertStoreInvariants(fx);
  },
);
