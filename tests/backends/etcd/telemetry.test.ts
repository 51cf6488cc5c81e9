/**
 * Metrics and traces of a known sequence on a private etcd, read back through the OpenTelemetry
 * SDK (an in-memory metric reader and span exporter installed as the global providers): 3 new
 * keys, 1 re-allocation, 1 release, 1 GC pass, then an outage (etcd killed) during an allocation.
 * In a file of its own: the global providers are process-wide.
 */
import assert from "node:assert/strict";
import { SpanStatusCode } from "@opentelemetry/api";
import { Allocator } from "../../../mod.ts";
import { EtcdBackend } from "../../../src/backends/etcd/mod.ts";
import { etcdUnavailable, startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { eventually } from "../../_support/eventually.ts";
import { childrenOf, installSdk, points, spansNamed, sum } from "../../_support/telemetry.ts";

const BASE = {
  "idalloc.backend": "etcd",
  "idalloc.prefix": "telemetry/test",
  "idalloc.node": "node-a",
};

Deno.test({
  name: "telemetry on etcd: exact counts and outcomes of a known sequence, then an outage",
  ignore: etcdUnavailable() !== undefined,
  async fn() {
    await using sdk = installSdk();
    await using etcd = await startEtcd();
    await using backend = await EtcdBackend.connect({
      endpoints: [...etcd.endpoints],
      prefix: BASE["idalloc.prefix"],
      node: BASE["idalloc.node"],
      requestTimeoutMs: 400,
      dialTimeoutMs: 5_000,
    });
    await using alloc = await Allocator.open(backend, {
      min: 1,
      max: 100,
      maxAttempts: 2,
      backoff: { initialMs: 10, maxMs: 20 },
    });
    await alloc.waitForInitialSync();

    const a = await alloc.allocate("a;");
    const b = await alloc.allocate("b;");
    const c = await alloc.allocate("c;");
    assert.deepEqual([a.isNew, b.isNew, c.isNew], [true, true, true]);
    assert.equal((await alloc.allocate("a;")).id, a.id); // re-allocation: held, no store access
    assert.deepEqual(await alloc.release("b;"), { lastUse: true });
    const gc = await alloc.runGc();
    assert.deepEqual([gc.marked, gc.deleted], [1, 0]);

    let m = await sdk.collect();
    const allocations = (outcome: string) =>
      sum(m, "idalloc.allocations", { ...BASE, "idalloc.outcome": outcome });
    assert.deepEqual(
      ["new", "existing", "cached", "failed"].map(allocations),
      [3, 0, 1, 0],
    );
    const durations = points(m, "idalloc.allocation.duration", { "idalloc.outcome": "new" });
    assert.equal(durations.length, 1);
    assert.equal(durations[0].value, 3);
    const trips = points(m, "idalloc.allocation.round_trips", { "idalloc.outcome": "new" });
    assert.deepEqual(trips.map((p) => [p.value, p.sum]), [[3, 3]], "one transaction per new key");
    assert.equal(sum(m, "idalloc.allocation.retries"), 0);
    assert.equal(sum(m, "idalloc.releases", { "idalloc.outcome": "last_use" }), 1);
    assert.equal(sum(m, "idalloc.releases"), 1);
    assert.equal(sum(m, "idalloc.release.duration"), 1);
    assert.equal(sum(m, "idalloc.gc.runs", { "idalloc.outcome": "ok" }), 1);
    assert.equal(sum(m, "idalloc.gc.ids", { "idalloc.gc.result": "marked" }), 1);
    assert.equal(sum(m, "idalloc.gc.ids", { "idalloc.gc.result": "deleted" }), 0);
    assert.equal(sum(m, "idalloc.gc.duration"), 1);
    const ops = (operation: string, outcome = "ok") =>
      sum(m, "idalloc.store.operations", {
        ...BASE,
        "idalloc.store.operation": operation,
        "idalloc.outcome": outcome,
      });
    assert.equal(ops("acquire"), 3);
    assert.equal(ops("release"), 1);
    assert.ok(ops("list masters") >= 1, "the initial list");
    assert.equal(sum(m, "idalloc.store.operations", { "idalloc.outcome": "error" }), 0);
    assert.equal(sum(m, "idalloc.watch.relists", { "idalloc.reason": "initial" }), 1);
    assert.equal(sum(m, "idalloc.store.batch.size", { "idalloc.store.operation": "acquire" }), 3);
    assert.equal(sum(m, "idalloc.keys.held", BASE), 2);
    // The cache learns the masters from the watch.
    await eventually(
      async () => sum(await sdk.collect(), "idalloc.cache.ids", BASE) === 3,
      "the cache holds the three IDs",
    );
    assert.equal(sum(m, "idalloc.ids.free", BASE), 97);
    // The three masters came back through the watch, each dated by its notification's arrival.
    await eventually(
      async () => sum(await sdk.collect(), "idalloc.watch.lag", BASE) === 3,
      "three changes applied from the watch",
    );
    assert.equal(sum(m, "idalloc.healthy", BASE), 1);
    assert.equal(sum(m, "idalloc.lease.lapses", BASE), 0);
    assert.equal(sum(m, "idalloc.keys.fenced", BASE), 0);

    // The outage: etcd is gone while a new key is allocated.
    await etcd.kill(0);
    await assert.rejects(alloc.allocate("d;"), { name: "AllocationFailedError" });
    m = await sdk.collect();
    assert.deepEqual(
      ["new", "existing", "cached", "failed"].map(allocations),
      [3, 0, 1, 1],
    );
    assert.equal(
      sum(m, "idalloc.allocations", { "error.type": "AllocationFailedError" }),
      1,
    );
    assert.equal(
      sum(m, "idalloc.allocation.retries", { "error.type": "StoreUnavailableError" }),
      1,
      "maxAttempts 2: one retry",
    );
    // The first attempt's create may have landed before etcd went (its answer is lost), so the
    // retry first asks whether it did ("read own create": isNew must survive a lost answer), and
    // fails there.
    const failedOps = (operation: string) =>
      sum(m, "idalloc.store.operations", {
        "idalloc.store.operation": operation,
        "idalloc.outcome": "error",
        "error.type": "StoreUnavailableError",
      });
    assert.deepEqual([failedOps("acquire"), failedOps("read own create")], [1, 1]);
    assert.ok(
      sum(m, "idalloc.store.retries", { "idalloc.store.operation": "acquire" }) >= 1,
      "the failed acquire retried on the member before giving up",
    );
    assert.equal(sum(m, "idalloc.allocation.duration", { "idalloc.outcome": "failed" }), 1);
    assert.equal(sum(m, "idalloc.healthy", BASE), 0);

    // Traces: no span for the cached hit; every store round trip under its call.
    const spans = sdk.spans();
    const allocates = spansNamed(spans, "idalloc.allocate");
    assert.deepEqual(
      allocates.map((s) => s.attributes["idalloc.outcome"]),
      ["new", "new", "new", "failed"],
    );
    for (const span of allocates.slice(0, 3)) {
      const children = childrenOf(spans, span);
      assert.deepEqual(children.map((s) => s.name), ["etcd acquire"]);
      assert.equal(children[0].attributes["idalloc.outcome"], "ok");
    }
    const failed = allocates[3];
    assert.equal(failed.status.code, SpanStatusCode.ERROR);
    assert.equal(failed.attributes["error.type"], "AllocationFailedError");
    assert.deepEqual(
      childrenOf(spans, failed).map((s) => [s.name, s.attributes["error.type"]]),
      [["etcd acquire", "StoreUnavailableError"], [
        "etcd read own create",
        "StoreUnavailableError",
      ]],
    );
    const [release] = spansNamed(spans, "idalloc.release");
    assert.equal(release.attributes["idalloc.outcome"], "last_use");
    assert.deepEqual(childrenOf(spans, release).map((s) => s.name), ["etcd release"]);
    const [gcSpan] = spansNamed(spans, "idalloc.gc");
    assert.equal(gcSpan.attributes["idalloc.gc.marked"], 1);
    assert.ok(childrenOf(spans, gcSpan).length > 0, "GC's reads are its children");
    const [initial] = spansNamed(spans, "idalloc.initial_sync");
    assert.equal(initial.attributes["idalloc.outcome"], "ok");
    assert.ok(childrenOf(spans, initial).some((s) => s.name === "etcd list masters"));
    assert.equal(
      spans.filter((s) => s.parentSpanContext === undefined && s.name.startsWith("etcd ")).length,
      0,
      "no store span outside an allocator's span",
    );
  },
});
