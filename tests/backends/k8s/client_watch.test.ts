// The watch stream's reads: lines split across chunks, an abort ends a stalled read, and reading
// keeps no chunk alive (a watch lives as long as its session: 3,000 chunks of 64 KiB read through
// it must not stay in memory).
import assert from "node:assert/strict";
import { WatchStream } from "../../../src/backends/k8s/client_watch.ts";

async function* chunks(count: number, size: number): AsyncGenerator<Uint8Array> {
  for (let i = 0; i < count; i++) {
    const chunk = new Uint8Array(size).fill(0x20);
    chunk.set(new TextEncoder().encode("{}"), 0);
    chunk[size - 1] = 0x0a;
    yield chunk;
  }
}

Deno.test("reading a long watch keeps none of the chunks it read", async () => {
  const stream = new WatchStream(undefined, 10_000, undefined);
  stream.headReceived();
  const before = Deno.memoryUsage().external;
  let lines = 0;
  for await (const _ of stream.lines(chunks(3_000, 64 * 1024))) lines++;
  const grown = Deno.memoryUsage().external - before;
  stream.dispose();
  assert.equal(lines, 3_000);
  // Kept, they would be 187.5 MiB; the collector leaves a few chunks at most.
  assert.ok(grown < 64 * 2 ** 20, `external memory grew by ${(grown / 2 ** 20).toFixed(1)} MiB`);
});

Deno.test("an abort ends a read that is waiting for a chunk", async () => {
  const caller = new AbortController();
  const stream = new WatchStream(caller.signal, 10_000, undefined);
  stream.headReceived();
  let reads = 0;
  // One line, then a body that never sends another chunk (as a stalled connection).
  const stalled: AsyncIterable<Uint8Array> = {
    [Symbol.asyncIterator]: () => ({
      next: () =>
        reads++ === 0
          ? Promise.resolve({ done: false, value: new TextEncoder().encode('{"type":"ADDED"}\n') })
          : new Promise<never>(() => {}),
      return: () => Promise.resolve({ done: true, value: undefined }),
    }),
  };
  const seen: string[] = [];
  const reading = (async () => {
    for await (const line of stream.lines(stalled)) seen.push(line);
  })();
  while (reads < 2) await new Promise((resolve) => setTimeout(resolve, 1));
  caller.abort(new Error("stop"));
  await assert.rejects(reading, { message: "stop" });
  stream.dispose();
  assert.deepEqual(seen, ['{"type":"ADDED"}']);
});
