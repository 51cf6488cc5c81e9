// Write-behind releases (`releaseInBackground`) on every backend: deletions land, a re-allocation
// cancels or waits for its key's deletion, and GC sees a release once it is flushed.
import assert from "node:assert/strict";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { assertStoreInvariants, keys, openNode } from "./_helpers.ts";

/** Live references of `node`, as key → ID. */
async function referencesOf(
  fx: { references(): Promise<{ key: string; node: string; id: number; live: boolean }[]> },
  node: string,
): Promise<Map<string, number>> {
  const refs = await fx.references();
  return new Map(refs.filter((r) => r.node === node && r.live).map((r) => [r.key, r.id]));
}

testEachBackendAndMode(
  "releaseInBackground: releases return, flush lands every deletion",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 256, releaseInBackground: true });
    const names = keys(40);
    for (const k of names) await a.allocate(k);
    assert.equal((await referencesOf(fx, "a")).size, 40);
    const results = await Promise.all(names.map((k) => a.release(k)));
    assert.ok(results.every((r) => r.lastUse));
    await a.flush();
    assert.equal((await referencesOf(fx, "a")).size, 0, "every reference deleted after flush");
    // Two passes collect the unused masters: nothing of a's pins them any more.
    await a.runGc();
    assert.equal((await a.runGc()).deleted, 40);
    await assertStoreInvariants(fx);
  },
);

testEachBackendAndMode(
  "releaseInBackground: re-allocating a key whose deletion is queued keeps its reference",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 256, releaseInBackground: true });
    const [first, second] = keys(2);
    const ids = [(await a.allocate(first)).id, (await a.allocate(second)).id];
    // `first` goes to the store at once; `second`'s deletion queues behind it.
    await a.release(first);
    await a.release(second);
    const again = await a.allocate(second);
    assert.equal(again.id, ids[1], "the same ID");
    assert.equal(again.firstUse, true);
    const back = await a.allocate(first);
    assert.equal(back.id, ids[0]);
    await a.flush();
    const refs = await referencesOf(fx, "a");
    assert.deepEqual([...refs].sort(), [[first, ids[0]], [second, ids[1]]].sort());
    // The references pin both IDs through GC.
    await a.runGc();
    await a.runGc();
    assert.equal((await fx.masters()).size, 2);
    await assertStoreInvariants(fx);
  },
);

testEachBackendAndMode(
  "releaseInBackground: release and re-allocate in a loop never loses the reference",
  async (f) => {
    await using fx = await f.create();
    await using a = await openNode(fx, "a", { max: 256, releaseInBackground: true });
    const names = keys(8);
    const ids = new Map<string, number>();
    for (const k of names) ids.set(k, (await a.allocate(k)).id);
    for (let round = 0; round < 25; round++) {
      await Promise.all(names.map(async (k) => {
        await a.release(k);
        assert.equal((await a.allocate(k)).id, ids.get(k));
      }));
    }
    await a.flush();
    assert.deepEqual(await referencesOf(fx, "a"), ids);
    await assertStoreInvariants(fx);
  },
);

testEachBackendAndMode("releaseInBackground: close lets queued deletions land", async (f) => {
  await using fx = await f.create();
  // A long lease: the references must be gone because the deletions landed, not lapsed.
  const a = await openNode(fx, "a", { max: 256, releaseInBackground: true, leaseTtlMs: 60_000 });
  const names = keys(20);
  for (const k of names) await a.allocate(k);
  for (const k of names) await a.release(k);
  await a.close();
  assert.equal((await referencesOf(fx, "a")).size, 0);
});
