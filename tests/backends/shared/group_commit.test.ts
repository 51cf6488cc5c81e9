/**
 * The queueing core of group commit, on its own (the backends' batchers are tested against real
 * stores in `tests/backends/*\/batch.test.ts`): the first call alone, the rest batched within the
 * limits in arrival order, no two writers of one key in a batch, aborted calls never sent.
 */
import assert from "node:assert/strict";
import { GroupCommit, type Member, settle } from "../../../src/backends/shared/group_commit.ts";

interface Call {
  readonly key: string;
  readonly weight: number;
}

/** A group whose sender records each batch and answers after `release()`. */
function recorder(limit: number, enabled = true) {
  const batches: string[][] = [];
  let open = Promise.withResolvers<void>();
  const group = new GroupCommit<Call, string>({
    enabled,
    limits: [limit],
    measure: (c) => ({ writes: new Set([c.key]), weights: [c.weight] }),
    send: async (batch: Member<Call, string>[]) => {
      batches.push(batch.map((m) => m.payload.key));
      await open.promise;
      for (const m of batch) settle(m, () => m.resolve(`done ${m.payload.key}`));
    },
  });
  const release = () => {
    open.resolve();
    open = Promise.withResolvers<void>();
  };
  return { group, batches, release };
}

const signal = () => AbortSignal.timeout(5_000);

Deno.test("group commit: the first call goes alone; the next ones share a batch", async () => {
  const { group, batches, release } = recorder(10);
  const first = group.submit({ key: "a", weight: 1 }, signal());
  const rest = ["b", "c", "d"].map((key) => group.submit({ key, weight: 1 }, signal()));
  assert.deepEqual(batches, [["a"]]);
  release();
  assert.equal(await first, "done a");
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(batches, [["a"], ["b", "c", "d"]]);
  release();
  assert.deepEqual(await Promise.all(rest), ["done b", "done c", "done d"]);
});

Deno.test("group commit: limits and shared keys split batches, in arrival order", async () => {
  const { group, batches, release } = recorder(3);
  const calls = [
    group.submit({ key: "a", weight: 1 }, signal()),
    group.submit({ key: "b", weight: 2 }, signal()),
    group.submit({ key: "b", weight: 1 }, signal()), // same key as the one before: next batch
    group.submit({ key: "c", weight: 1 }, signal()),
    group.submit({ key: "d", weight: 2 }, signal()), // over the limit of 3: next batch
  ];
  for (let i = 0; i < 4; i++) {
    release();
    await new Promise((r) => setTimeout(r, 0));
  }
  await Promise.all(calls);
  assert.deepEqual(batches, [["a"], ["b", "c"], ["b", "d"]]);
});

Deno.test("group commit: a call aborted while queued is never sent", async () => {
  const { group, batches, release } = recorder(10);
  const first = group.submit({ key: "a", weight: 1 }, signal());
  const controller = new AbortController();
  const gone = group.submit({ key: "b", weight: 1 }, controller.signal);
  controller.abort(new Error("gone"));
  await assert.rejects(gone, { message: "gone" });
  release();
  await first;
  await new Promise((r) => setTimeout(r, 0));
  assert.deepEqual(batches, [["a"]]);
});

Deno.test("group commit: disabled, every call is sent at once on its own", async () => {
  const { group, batches, release } = recorder(10, false);
  const calls = ["a", "b", "c"].map((key) => group.submit({ key, weight: 1 }, signal()));
  assert.deepEqual(batches, [["a"], ["b"], ["c"]]);
  release();
  await Promise.all(calls);
});
