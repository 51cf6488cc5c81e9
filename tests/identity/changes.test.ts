import assert from "node:assert/strict";
import { Labels } from "../../src/identity/mod.ts";
import { ChangeHub } from "../../src/identity/changes.ts";
import type { IdentityChange } from "../../src/identity/types.ts";
import { test } from "../_support/test.ts";

const foo = Labels.parse(["unspec:id=foo"]);
const range = (from: number, to: number) =>
  Array.from({ length: to - from + 1 }, (_, i) => from + i);

/** Applies batches to a model of the owner's identity cache, until `until` says stop. */
async function drain(
  stream: AsyncIterator<IdentityChange>,
  model: Map<number, Labels>,
  until: (batch: IdentityChange) => boolean,
): Promise<IdentityChange[]> {
  const batches: IdentityChange[] = [];
  while (true) {
    const { value, done } = await stream.next();
    if (done) return batches;
    for (const id of value.added.keys()) assert.ok(!value.deleted.has(id), "disjoint");
    for (const [id, labels] of value.added) model.set(id, labels);
    for (const id of value.deleted) model.delete(id);
    batches.push(value);
    if (until(value)) return batches;
  }
}

test("TestEventWatcherBatching", async () => {
  const hub = new ChangeHub();
  const controller = new AbortController();
  const stream = hub.subscribe([], controller.signal)[Symbol.asyncIterator]();
  const model = new Map<number, Labels>();

  // 1. Upserts 1024..1033.
  for (const id of range(1024, 1033)) hub.add(id, foo);
  await drain(stream, model, (b) => b.added.has(1033));
  assert.equal(model.get(1033), foo);

  // 2. Deletes 1024..1033.
  for (const id of range(1024, 1033)) hub.delete(id);
  await drain(stream, model, (b) => b.deleted.has(1033));
  assert.equal(model.size, 0);

  // 3. Upserts 2048..2057 then deletes 2048..2052 back to back: one batch, adds cancelled.
  for (const id of range(2048, 2057)) hub.add(id, foo);
  for (const id of range(2048, 2052)) hub.delete(id);
  const [batch] = await drain(stream, model, (b) => b.deleted.has(2052));
  assert.deepEqual([...batch.added.keys()], range(2053, 2057));
  assert.deepEqual([...batch.deleted], range(2048, 2052));
  assert.equal(model.get(2052), undefined);

  // 4. Deletes 2053..2057.
  for (const id of range(2053, 2057)) hub.delete(id);
  await drain(stream, model, (b) => b.deleted.has(2057));
  assert.equal(model.size, 0);

  controller.abort();
  assert.equal((await stream.next()).done, true);
  assert.equal(hub.subscribers, 0);
});

test("a delete then an add in one batch leaves only the add", async () => {
  const hub = new ChangeHub();
  const stream = hub.subscribe([[7, foo]], undefined)[Symbol.asyncIterator]();
  const first = await stream.next();
  assert.deepEqual([...first.value!.added.keys()], [7]); // the replay batch
  hub.delete(7);
  hub.add(7, foo);
  const next = await stream.next();
  assert.deepEqual([...next.value!.added.keys()], [7]);
  assert.equal(next.value!.deleted.size, 0);
  hub.close();
  assert.equal((await stream.next()).done, true);
});

test("producers never wait: a slow subscriber gets one folded batch", async () => {
  const hub = new ChangeHub();
  const fast = hub.subscribe([], undefined)[Symbol.asyncIterator]();
  const slow = hub.subscribe([], undefined)[Symbol.asyncIterator]();
  const fastFirst = fast.next();
  // The slow one has not asked yet; 100k events must not queue up per event.
  for (let i = 0; i < 100_000; i++) hub.add(i % 10, foo);
  for (let i = 0; i < 5; i++) hub.delete(i);
  assert.equal((await fastFirst).value!.added.size, 5);
  const batch = (await slow.next()).value!;
  assert.equal(batch.added.size, 5);
  assert.equal(batch.deleted.size, 5);
  hub.close();
  assert.equal((await fast.next()).done, true);
  assert.equal((await slow.next()).done, true);
});

test("abort ends a waiting stream at once, without a pending batch", async () => {
  const hub = new ChangeHub();
  const controller = new AbortController();
  const stream = hub.subscribe([], controller.signal)[Symbol.asyncIterator]();
  const waiting = stream.next();
  controller.abort();
  assert.equal((await waiting).done, true);
  hub.add(1, foo);
  assert.equal(hub.subscribers, 0);
  // Subscribing with an aborted signal or after close yields nothing.
  const none = hub.subscribe([[1, foo]], controller.signal)[Symbol.asyncIterator]();
  assert.equal((await none.next()).done, true);
  hub.close();
  const closed = hub.subscribe([[1, foo]], undefined)[Symbol.asyncIterator]();
  assert.equal((await closed.next()).done, true);
});
