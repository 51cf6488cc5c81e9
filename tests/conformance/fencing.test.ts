/**
 * Fencing, on every backend, with real processes: a node stopped (SIGSTOP) past its lease, whose
 * key was collected and given to another key meanwhile, never answers that ID again once it
 * resumes; it re-acquires the key under a new ID that the store and the other node agree on, and
 * says so (`reassigned`). The order of events is asserted, not their timing; the measured windows
 * are printed for the record.
 */
import assert from "node:assert/strict";
import { Allocator, type AllocatorEvent } from "../../mod.ts";
import { keyHash } from "../../src/allocator/id_pool.ts";
import { testEachBackendAndMode } from "../_support/factories.ts";
import { eventually } from "../_support/eventually.ts";
import { StallChild } from "./_stall_child.ts";

const K = "k8s:app=stalled;";

testEachBackendAndMode(
  "a node stalled past its lease stops answering the ID it lost",
  async (factory) => {
    await using fx = await factory.create();
    const leaseTtlMs = factory.traits.minLeaseTtlMs;
    await using child = new StallChild(fx.spec(), "node-a", K, 10, leaseTtlMs);
    const held = await child.next((l) => l.event === "held");
    const x = held.id!;
    await child.next((l) => l.event === "sample" && l.get === x);

    const backend = await fx.backend("node-b", { fast: true });
    await using b = await Allocator.open(backend, { max: 10, leaseTtlMs: 5_000 });
    await b.waitForInitialSync();
    await eventually(() => b.cachedId(K) === x, "node b sees the key's ID");

    child.stop();
    const stoppedAt = Date.now();
    // Node b collects the stalled node's key once its lease lapsed (two passes)…
    await eventually(async () => (await b.runGc()).deletedIds.includes(x), `ID ${x} is collected`);
    // …and gives the ID to another key: one whose hash makes ID x its first candidate.
    await eventually(() => b.cachedKey(x) === undefined, "node b's cache drops the ID");
    let i = 0;
    while (1 + keyHash(`k8s:taker=${i};`) % 10 !== x) i++;
    const taker = `k8s:taker=${i};`;
    assert.equal((await b.allocate(taker)).id, x);

    child.resume();
    const resumedAt = Date.now();
    const reassigned = await child.next((l) => l.event === "watch" && l.type === "reassigned");
    const n = reassigned.newId!;
    assert.deepEqual(
      { key: reassigned.key, oldId: reassigned.oldId },
      { key: K, oldId: x },
      "the held key was reassigned from the ID it lost",
    );
    assert.notEqual(n, x);
    await child.next((l) => l.event === "sample" && l.t0 > reassigned.t && l.get === n);
    // The store, node a and node b agree on the key's new ID; the lost ID is the taker's. Read
    // while node a runs: its lease is the backend's shortest (1 s on Kubernetes), and once its
    // process has exited (which took over a second under load on Bun) its reference is no longer
    // live.
    const masters = await fx.masters();
    assert.equal(masters.get(n), K);
    assert.equal(masters.get(x), taker);
    const refs = (await fx.references()).filter((r) => r.key === K && r.live);
    assert.deepEqual(refs.map((r) => [r.node, r.id]), [["node-a", n]]);
    const final = await child.finish();

    // No call that started after the resume answered the lost ID, by any of the three paths.
    const after = child.lines.filter((l) => l.event === "sample" && l.t0 >= resumedAt);
    for (const s of after) {
      assert.ok(
        s.get !== x && s.cached !== x && s.allocate !== x,
        `answered ${x} after resuming: ${JSON.stringify(s)}`,
      );
    }
    await eventually(() => b.cachedId(K) === n, "node b learns the new ID");
    assert.equal(await b.getNoCache(K), n);
    const fence = final.fence!;
    assert.equal(fence.reassigned, 1);
    assert.ok(fence.lapses + fence.replacements >= 1, JSON.stringify(fence));
    assert.equal(final.healthy, true);

    // For the record (the closing note quotes these): how soon after resuming the node stopped
    // answering from memory, and when it had the new ID.
    const firstFenced = after.find((s) => s.fenced || s.get !== x);
    console.error(
      `[${factory.kind}] stalled ${resumedAt - stoppedAt} ms; after resuming: first sample ` +
        `${firstFenced ? firstFenced.t0 - resumedAt : "-"} ms, reassigned ` +
        `${
          (reassigned.t as number) - resumedAt
        } ms; stale answers after resuming: 0 of ${after.length}`,
    );
  },
);

testEachBackendAndMode(
  "a held key whose ID the store gives to another key moves to a new ID",
  async (factory) => {
    await using fx = await factory.create();
    const backend = await fx.backend("node-a", { fast: true });
    await using a = await Allocator.open(backend, { max: 100, syncIntervalMs: 600_000 });
    const { id: x } = await a.allocate("k8s:held=1;");
    await a.allocate("k8s:held=1;"); // two local uses: both move
    const events: AllocatorEvent[] = [];
    const stop = new AbortController();
    const watching = (async () => {
      for await (const e of a.watch({ signal: stop.signal })) {
        if (e.type !== "synced") events.push(e);
      }
    })();
    // A writer that ignores the protocol gives the ID to another key.
    await fx.rewriteMaster(x, "k8s:intruder=1;");
    await eventually(() => events.some((e) => e.type === "reassigned"), "the key is reassigned");
    const moved = events.find((e) => e.type === "reassigned")!;
    assert.equal(moved.type === "reassigned" && moved.oldId, x);
    const n = moved.type === "reassigned" ? moved.newId : 0;
    assert.notEqual(n, x);
    assert.equal(await a.get("k8s:held=1;"), n);
    assert.equal(a.cachedId("k8s:held=1;"), n);
    assert.equal(a.cachedKey(x), "k8s:intruder=1;");
    const status = a.status();
    assert.deepEqual(
      { conflicts: status.fence.conflicts, reassigned: status.fence.reassigned },
      { conflicts: 1, reassigned: 1 },
    );
    assert.equal(status.healthy, true);
    // Both local uses moved: two releases, the second the last.
    assert.deepEqual(await a.release("k8s:held=1;"), { lastUse: false });
    assert.deepEqual(await a.release("k8s:held=1;"), { lastUse: true });
    const masters = await fx.masters();
    assert.equal(masters.get(n), "k8s:held=1;");
    assert.equal(masters.get(x), "k8s:intruder=1;");
    stop.abort();
    await watching;
  },
);

testEachBackendAndMode(
  "a lost lease fences every held key until its references are back",
  async (factory) => {
    await using fx = await factory.create();
    const backend = await fx.backend("node-a", { fast: true });
    await using a = await Allocator.open(backend, {
      max: 100,
      leaseTtlMs: 2_000,
      syncIntervalMs: 600_000,
    });
    const held = new Map<string, number>();
    for (let i = 0; i < 5; i++) held.set(`k8s:lost=${i};`, (await a.allocate(`k8s:lost=${i};`)).id);
    await fx.dropLease("node-a");
    // The node notices at its next renewal, re-checks every held key and puts its references back.
    await eventually(() => a.status().fence.replacements === 1, "the lease was replaced");
    await eventually(
      async () => (await fx.references()).filter((r) => r.node === "node-a" && r.live).length === 5,
      "every reference is back under a live lease",
    );
    await eventually(() => a.status().healthy, "the fence is down");
    for (const [key, id] of held) assert.equal(await a.get(key), id, "same IDs: nothing was taken");
    assert.equal(a.status().fence.reassigned, 0);
  },
);
