/**
 * Group commit on a real Deno KV file: concurrent acquisitions share commits, a lost race of one
 * key costs its batch-mates one commit each on their own and never their result, releases share
 * commits, and with `groupCommit: false` every acquisition is its own commit.
 */
import assert from "node:assert/strict";
import { TestStore } from "./_helpers.ts";

const signal = () => AbortSignal.timeout(10_000);
const picker = (first: number) => (exclude: ReadonlySet<number>) => {
  for (let id = first;; id++) if (!exclude.has(id)) return id;
};

Deno.test("kv batch: 40 concurrent new keys take fewer commits, every one created once", async () => {
  await using store = await TestStore.create();
  const session = await store.session("a");
  const results = await Promise.all(
    Array.from(
      { length: 40 },
      (_, i) =>
        session.acquire({ key: `k${i};`, pickCandidate: picker(100 + i), signal: signal() }),
    ),
  );
  assert.deepEqual(results.map((r) => r.id), Array.from({ length: 40 }, (_, i) => 100 + i));
  assert.ok(results.every((r) => r.created));
  const { commits, plans, largest } = session.batcher.stats;
  assert.equal(plans, 40);
  assert.ok(commits < 40 && largest > 1, `${commits} commits for 40 (largest ${largest})`);
  const masters = (await store.dump()).filter((e) => e.key[0] === "id");
  assert.equal(masters.length, 40);
});

Deno.test("kv batch: one key's lost race never fails its batch-mates", async () => {
  await using store = await TestStore.create();
  const session = await store.session("a");
  // ID 107 is taken by another key: k7's first commit fails, the rest must not.
  await session.acquire({ key: "other;", pickCandidate: () => 107, signal: signal() });
  // Each key's second candidate is one nobody else picks (the allocator's pool leases them so).
  const candidates = (i: number) => (ex: ReadonlySet<number>) =>
    ex.has(100 + i) ? 200 + i : 100 + i;
  const results = await Promise.all(
    Array.from(
      { length: 16 },
      (_, i) => session.acquire({ key: `k${i};`, pickCandidate: candidates(i), signal: signal() }),
    ),
  );
  assert.equal(results[7].id, 207, "k7 moved past the taken candidate");
  results.forEach((r, i) => i !== 7 && assert.equal(r.id, 100 + i));
  assert.ok(session.batcher.stats.splits >= 1, "a shared commit was split");
});

Deno.test("kv batch: concurrent releases share commits", async () => {
  await using store = await TestStore.create();
  const session = await store.session("a");
  for (let i = 0; i < 20; i++) {
    await session.acquire({ key: `k${i};`, pickCandidate: () => 100 + i, signal: signal() });
  }
  const before = session.batcher.stats.commits;
  await Promise.all(Array.from({ length: 20 }, (_, i) => session.release(`k${i};`, 0, signal())));
  assert.ok(session.batcher.stats.commits - before < 20);
  assert.equal((await store.dump()).filter((e) => e.key[0] === "ref").length, 0);
});

Deno.test("kv batch: groupCommit off makes every acquisition its own commit", async () => {
  await using store = await TestStore.create();
  const session = await store.session("a", { groupCommit: false });
  await Promise.all(
    Array.from(
      { length: 10 },
      (_, i) => session.acquire({ key: `k${i};`, pickCandidate: () => 100 + i, signal: signal() }),
    ),
  );
  assert.deepEqual(session.batcher.stats, { commits: 10, plans: 10, splits: 0, largest: 0 });
});
