/**
 * Every options object idalloc takes is parsed strictly and its problems are told in one voice:
 * `invalid <what>: '<option>' <problem>`, a misspelt option named with the one it most likely meant.
 */
import assert from "node:assert/strict";
import { Allocator, DenoKvBackend, InvalidOptionsError } from "../../mod.ts";
import { EtcdBackend } from "../../src/backends/etcd/mod.ts";
import { IdentityAllocator } from "../../src/identity/mod.ts";

function messageOf(fn: () => unknown): Promise<string> {
  return Promise.resolve().then(fn).then(
    () => assert.fail("accepted"),
    (err) => {
      assert.ok(err instanceof InvalidOptionsError, String(err));
      return err.message;
    },
  );
}

Deno.test("a misspelt option is refused by every options parser, in the same words", async () => {
  using kv = await Deno.openKv(":memory:");
  const backend = new DenoKvBackend(kv, { prefix: ["p"], node: "a" });
  assert.equal(
    await messageOf(() =>
      new DenoKvBackend(kv, { prefix: ["p"], node: "a", pollIntervallMs: 5 } as never)
    ),
    "invalid Deno KV backend options: 'pollIntervallMs' is not an option (did you mean 'pollIntervalMs'?)",
  );
  assert.equal(
    await messageOf(() => Allocator.open(backend, { max: 100, mni: 5 } as never)),
    "invalid allocator options: 'mni' is not an option (did you mean 'min'?)",
  );
  assert.equal(
    await messageOf(() =>
      EtcdBackend.connect(
        { endpoints: ["http://127.0.0.1:1"], node: "a", dialTimeouMs: 5 } as never,
      )
    ),
    "invalid etcd backend options: 'dialTimeouMs' is not an option (did you mean 'dialTimeoutMs'?)",
  );
  assert.equal(
    await messageOf(() => IdentityAllocator.open(backend, { clusterID: 1 } as never)),
    "invalid identity allocator options: 'clusterID' is not an option (did you mean 'clusterId'?)",
  );
});

Deno.test("values are judged in plain words, never in the validator's jargon", async () => {
  using kv = await Deno.openKv(":memory:");
  const backend = new DenoKvBackend(kv, { prefix: ["p"], node: "a" });
  assert.equal(
    await messageOf(() => new DenoKvBackend(kv, { prefix: [], node: "a" })),
    "invalid Deno KV backend options: 'prefix' must not be empty",
  );
  assert.equal(
    await messageOf(() => Allocator.open(backend, { max: 100, min: 0 })),
    "invalid allocator options: 'min' must be at least 1",
  );
  assert.equal(
    await messageOf(() => Allocator.open(backend, { max: 100, leaseTtlMs: 10 })),
    "invalid allocator options: 'leaseTtlMs' must be at least 500",
  );
  assert.equal(
    await messageOf(() => new DenoKvBackend(kv, { node: "a" } as never)),
    "invalid Deno KV backend options: 'prefix' is required",
  );
});
