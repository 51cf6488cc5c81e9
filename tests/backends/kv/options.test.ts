import assert from "node:assert/strict";
import { InvalidKeyError, InvalidOptionsError } from "../../../src/errors.ts";
import { DenoKvBackend } from "../../../src/backends/kv/mod.ts";
import { partBytes } from "../../../src/backends/kv/layout.ts";
import { isKvU64 } from "../../../src/backends/kv/schema.ts";
import { KV_FIXTURE_PREFIX, never, request, TestStore } from "./_helpers.ts";

Deno.test("kv options: invalid options are an InvalidOptionsError", async () => {
  using kv = await Deno.openKv(":memory:");
  const bad: unknown[] = [
    { prefix: [], node: "a" },
    { prefix: [true], node: "a" },
    { prefix: [new Uint8Array([1])], node: "a" },
    { prefix: ["p"], node: "" },
    { prefix: ["p"], node: "a/b" },
    { prefix: ["p"], node: "n".repeat(254) },
    { prefix: ["p"], node: "a", pollIntervalMs: 0 },
    { prefix: ["p"], node: "a", resyncIntervalMs: -1 },
    { prefix: ["p"], node: "a", maxClockSkewMs: 1.5 },
    { prefix: ["p"], node: "a", now: 5 },
    { prefix: ["p"], node: "a", logRetentionMs: 1_000 },
    { prefix: ["x".repeat(2_040)], node: "a" },
    { prefix: ["p"], node: "a", kvU64: class NotACounter {} },
    { prefix: ["p"], node: "a", kvU64: 0 },
    undefined,
  ];
  for (const options of bad) {
    assert.throws(
      () => new DenoKvBackend(kv, options as never),
      InvalidOptionsError,
      JSON.stringify(options),
    );
  }
  assert.throws(
    () => new DenoKvBackend({} as Deno.Kv, { prefix: ["p"], node: "a" }),
    InvalidOptionsError,
  );
  const ok = new DenoKvBackend(kv, { prefix: ["p", 1], node: "n".repeat(253) });
  assert.equal(ok.kind, "deno-kv");
  assert.equal(ok.node, "n".repeat(253));
});

Deno.test("kv options: kvU64 takes a KvU64 class; counters of either package are recognized", async () => {
  using kv = await Deno.openKv(":memory:");
  assert.equal(new DenoKvBackend(kv, { prefix: ["p"], node: "a", kvU64: Deno.KvU64 }).node, "a");
  assert.equal(isKvU64(new Deno.KvU64(3n)), true);
  // @deno/kv's class is named `_KvU64` (its build renames it): the same shape, another class.
  class _KvU64 {
    readonly value: bigint;
    constructor(value: bigint) {
      this.value = value;
    }
  }
  assert.equal(isKvU64(new _KvU64(3n)), true);
  assert.equal(
    new DenoKvBackend(kv, { prefix: ["p"], node: "a", kvU64: _KvU64 as never }).node,
    "a",
  );
  // What a store can hand back for garbage written over a counter is never one.
  for (const garbage of [{ value: 3n }, 3n, "3", null, new Map([["value", 3n]])]) {
    assert.equal(isKvU64(garbage), false, String(garbage));
  }
});

/** The longest key (in ASCII characters) checkKey accepts for this prefix and node. */
function longestAscii(backend: DenoKvBackend): number {
  let n = 1;
  while (true) {
    try {
      backend.checkKey("k".repeat(n + 1));
      n++;
    } catch {
      return n;
    }
  }
}

Deno.test("kv checkKey: empty and oversize keys are refused before anything is written", async () => {
  await using store = await TestStore.create();
  const backend = await store.backend("node-a");
  assert.throws(() => backend.checkKey(""), InvalidKeyError);
  const max = longestAscii(backend);
  // The limit is the store's own: the reference key [...P, "ref", key, node] is 2048 bytes.
  const overhead = KV_FIXTURE_PREFIX.reduce((n, p) => n + partBytes(p), 0) + partBytes("ref") +
    partBytes("node-a") + 2;
  assert.equal(max, 2048 - overhead);
  assert.throws(() => backend.checkKey("k".repeat(max + 1)), InvalidKeyError);
  // Multi-byte characters and NULs count by their encoded size.
  assert.throws(() => backend.checkKey("é".repeat(Math.floor(max / 2) + 1)), InvalidKeyError);
  backend.checkKey("é".repeat(Math.floor(max / 2)));
  assert.throws(() => backend.checkKey("\0".repeat(Math.floor(max / 2) + 1)), InvalidKeyError);
  backend.checkKey("\0".repeat(Math.floor(max / 2)));

  // The longest accepted keys really fit: the store takes every write of an acquire.
  const session = await backend.openSession({
    leaseTtlMs: 60_000,
    readOnly: false,
    onLeaseReplaced: () => {},
  });
  try {
    const res = await session.acquire(request("k".repeat(max), { first: 1 }));
    assert.equal(res.created, true);
    await session.acquire(request("\0".repeat(Math.floor(max / 2)), { first: 2 }));
    assert.equal(await session.get("k".repeat(max), never), 1);
  } finally {
    await session.close();
  }
  // ...and one byte more is what the store itself refuses.
  await assert.rejects(
    store.kv.set([...KV_FIXTURE_PREFIX, "ref", "k".repeat(max + 1), "node-a"], 1),
    /Key too large/,
  );
});
