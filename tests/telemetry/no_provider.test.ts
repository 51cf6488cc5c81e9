/**
 * With no OpenTelemetry provider installed, idalloc records nothing and everything works; a
 * provider installed later (after import, after `Allocator.open`) gets the signals from then on.
 * In a file of its own: the global providers are process-wide.
 */
import assert from "node:assert/strict";
import { metrics, trace } from "@opentelemetry/api";
import { Allocator, DenoKvBackend } from "../../mod.ts";
import { IdentityAllocator, Labels } from "../../src/identity/mod.ts";
import { eventually } from "../_support/eventually.ts";
import { installSdk, points, sum } from "../_support/telemetry.ts";

Deno.test("telemetry: no provider installed — nothing recorded, nothing breaks; a later one sees what follows", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-telemetry-" });
  try {
    using kv = await Deno.openKv(`${dir}/t.kv`);
    assert.equal(metrics.getMeterProvider().constructor.name, "NoopMeterProvider");
    assert.equal(trace.getTracer("probe").startSpan("probe").isRecording(), false);
    const backend = new DenoKvBackend(kv, { prefix: ["none"], node: "a" });
    await using alloc = await Allocator.open(backend, { max: 100 });
    await alloc.waitForInitialSync();
    const keys = ["k1", "k2", "k3"];
    for (const k of keys) assert.equal((await alloc.allocate(k)).isNew, true);
    assert.equal((await alloc.allocate("k1")).firstUse, false);
    assert.deepEqual(await alloc.release("k2"), { lastUse: true });
    assert.equal((await alloc.runGc()).marked, 1);
    // The counts behind `idalloc.allocations` are the allocator's own, provider or not.
    assert.deepEqual(alloc.status().allocations, { new: 3, existing: 0, cached: 1, failed: 0 });
    await alloc.sync();
    await using identities = await IdentityAllocator.open(
      new DenoKvBackend(kv, { prefix: ["none-ids"], node: "a" }),
    );
    await identities.allocate(Labels.parse(["k8s:app=web"]));

    // A provider installed now: nothing of the above was recorded as a measurement…
    await using sdk = installSdk();
    let m = await sdk.collect();
    for (
      const name of [
        "idalloc.store.operations",
        "idalloc.allocation.duration",
        "idalloc.releases",
        "idalloc.gc.runs",
      ]
    ) {
      assert.deepEqual(points(m, name), [], `${name} recorded without a provider`);
    }
    // …and what follows is recorded: the first call that reaches the store (or a lease renewal)
    // finds the new provider, and the observable instruments report the allocators' state.
    assert.equal((await alloc.allocate("k4")).isNew, true);
    m = await sdk.collect();
    assert.equal(sum(m, "idalloc.keys.held", { "idalloc.prefix": "none" }), 3);
    assert.equal(
      sum(m, "idalloc.allocations", { "idalloc.prefix": "none", "idalloc.outcome": "new" }),
      4,
      "since open",
    );
    // The global identity reaches the cache through the store's change feed.
    await eventually(
      async () =>
        sum(await sdk.collect(), "idalloc.identities", { "idalloc.identity.scope": "global" }) ===
          1,
      "the global identity is counted",
    );
    assert.equal(sum(m, "idalloc.allocation.duration", { "idalloc.outcome": "new" }), 1);
    assert.equal(
      sum(m, "idalloc.store.operations", {
        "idalloc.prefix": "none",
        "idalloc.store.operation": "commit",
        "idalloc.outcome": "ok",
      }),
      1,
    );
    assert.deepEqual(
      sdk.spans().map((s) => s.name),
      ["deno-kv commit", "idalloc.allocate"],
    );
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});
