import assert from "node:assert/strict";
import { untilAborted } from "../../src/identity/abortable.ts";

/** A source that yields its values and then misses every abort: its next() never settles. */
function stuckAfter<T>(values: T[]): AsyncIterable<T> {
  return {
    [Symbol.asyncIterator]() {
      let i = 0;
      return {
        next: () =>
          i < values.length
            ? Promise.resolve({ done: false, value: values[i++] })
            : new Promise<IteratorResult<T>>(() => {}),
        return: () => new Promise<IteratorResult<T>>(() => {}),
      };
    },
  };
}

Deno.test("untilAborted returns on abort even if the source never settles", async () => {
  const controller = new AbortController();
  const seen: number[] = [];
  for await (const value of untilAborted(stuckAfter([1, 2, 3]), controller.signal)) {
    seen.push(value);
    if (value === 3) queueMicrotask(() => controller.abort());
  }
  assert.deepEqual(seen, [1, 2, 3]);
});

Deno.test("untilAborted ends with the source and on an already-aborted signal", async () => {
  async function* three() {
    yield* [1, 2, 3];
  }
  const all: number[] = [];
  for await (const v of untilAborted(three(), new AbortController().signal)) all.push(v);
  assert.deepEqual(all, [1, 2, 3]);
  const none: number[] = [];
  for await (const v of untilAborted(three(), AbortSignal.abort())) none.push(v);
  assert.deepEqual(none, []);
});

Deno.test("untilAborted passes a source's error through", async () => {
  async function* failing() {
    yield 1;
    throw new Error("boom");
  }
  await assert.rejects(async () => {
    for await (const _ of untilAborted(failing(), new AbortController().signal)) { /* drain */ }
  }, /boom/);
});
