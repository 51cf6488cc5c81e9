/**
 * Metrics and traces of a known sequence on a private kube-apiserver, read back through the
 * OpenTelemetry SDK (tests/_support/telemetry.ts): 3 new keys, 1 re-allocation, 1 release, 1 GC
 * pass, then an outage (the API server killed) during an allocation. Every API request is one
 * round trip `<verb> <plural>`; the node Lease's renewals, the informer's failed watches and its
 * re-list after the restart (`410`: the new watch cache starts past the informer's version) are
 * counted as on the other backends. In a file of its own: the global providers are process-wide.
 */
import assert from "node:assert/strict";
import { SpanStatusCode } from "@opentelemetry/api";
import { Allocator } from "../../../mod.ts";
import { K8sBackend } from "../../../src/backends/k8s/backend.ts";
import {
  kubeApiserverUnavailable,
  startKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { rawClient } from "../../../src/backends/etcd/testing/fixture.ts";
import { eventually } from "../../_support/eventually.ts";
import { childrenOf, installSdk, points, spansNamed, sum } from "../../_support/telemetry.ts";

const NODE = "node-a";

Deno.test({
  name: "telemetry on k8s: exact counts and outcomes of a known sequence, then an outage",
  ignore: kubeApiserverUnavailable() !== undefined,
  async fn() {
    await using sdk = installSdk();
    await using cluster = await startKubeApiServer({ ciliumCrds: false });
    const identities = await cluster.installIdentityCrd();
    const kubeconfig = await cluster.kubeconfig("admin", { namespace: "default", current: true });
    await using backend = await K8sBackend.connect({
      node: NODE,
      kubeconfig,
      namespace: "default",
      resource: { group: identities.group },
      endpoints: false,
      maxClockSkewMs: 500,
      requestTimeoutMs: 2_000,
    });
    const BASE = {
      "idalloc.backend": "k8s",
      "idalloc.prefix": `ciliumidentities.${identities.group}/v2`,
      "idalloc.node": NODE,
    };
    await using alloc = await Allocator.open(backend, {
      min: 1,
      max: 100,
      leaseTtlMs: 3_000,
      // No grace: b, just created, is marked at the first pass (this store's default keeps a new
      // identity for Cilium's heartbeat timeout).
      gcGraceMs: 0,
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
    assert.deepEqual(["new", "existing", "cached", "failed"].map(allocations), [3, 0, 1, 0]);
    // A new key uncontended: its claim (a Lease) and the node's reference (its reference object)
    // in parallel, then the identity: three requests in two round trips.
    const trips = points(m, "idalloc.allocation.round_trips", { "idalloc.outcome": "new" });
    assert.deepEqual(trips.map((p) => [p.value, p.sum]), [[3, 9]], "three requests per new key");
    const ops = (operation: string, outcome = "ok") =>
      sum(m, "idalloc.store.operations", {
        ...BASE,
        "idalloc.store.operation": operation,
        "idalloc.outcome": outcome,
      });
    assert.equal(ops("create ciliumidentities"), 3);
    assert.ok(ops("create leases") >= 5, "three claims, the node's Lease and reference object");
    assert.ok(ops("patch leases") >= 3, "two references and the release, in the node's object");
    assert.ok(ops("patch ciliumidentities") >= 1, "GC's mark");
    assert.ok(ops("list ciliumidentities") >= 2, "the informer's list and GC's");
    assert.ok(ops("watch ciliumidentities") >= 1, "the informer's watch");
    assert.equal(sum(m, "idalloc.store.operations", { "idalloc.outcome": "error" }), 0);
    assert.equal(
      sum(m, "idalloc.store.operation.duration", {
        "idalloc.store.operation": "create ciliumidentities",
      }),
      3,
      "each create timed",
    );
    assert.equal(sum(m, "idalloc.keys.held", BASE), 2);
    const relists = (metrics: typeof m, reason: string) =>
      sum(metrics, "idalloc.watch.relists", { ...BASE, "idalloc.reason": reason });
    assert.equal(relists(m, "initial"), 1, "the informer's first list");
    assert.equal(sum(m, "idalloc.watch.reconnects", BASE), 0);
    const renewals = (metrics: typeof m, outcome: string, type?: string) =>
      sum(metrics, "idalloc.lease.renewals", {
        ...BASE,
        "idalloc.outcome": outcome,
        ...(type === undefined ? {} : { "error.type": type }),
      });
    // Every third of the 3 s lease TTL.
    await eventually(
      async () => renewals(await sdk.collect(), "ok") >= 1,
      "a renewal of the node's Lease is counted",
    );
    await eventually(
      async () => sum(await sdk.collect(), "idalloc.cache.ids", BASE) === 3,
      "the cache holds the three IDs",
    );

    // The outage: the API server is gone while a new key is allocated.
    await cluster.kill();
    await assert.rejects(alloc.allocate("d;"), { name: "AllocationFailedError" });
    m = await sdk.collect();
    assert.deepEqual(["new", "existing", "cached", "failed"].map(allocations), [3, 0, 1, 1]);
    // A request on a pooled connection the dying server dropped fails as unavailable (retryable),
    // a new connection as refused: either way each attempt's request is counted as failed.
    const failed = (type: string) =>
      sum(m, "idalloc.store.operations", { "idalloc.outcome": "error", "error.type": type });
    assert.ok(
      failed("StoreConnectionRefusedError") >= 1 &&
        failed("StoreConnectionRefusedError") + failed("StoreUnavailableError") >= 2,
      "each attempt's request failed, the last refused",
    );

    // Traces: every store round trip of a call under its span.
    const spans = sdk.spans();
    const allocates = spansNamed(spans, "idalloc.allocate");
    assert.deepEqual(
      allocates.map((s) => s.attributes["idalloc.outcome"]),
      ["new", "new", "new", "failed"],
    );
    // The claim and the reference (the node's object: created by the first key, patched by the
    // others) in parallel, then the identity.
    const reference = ["k8s create leases", "k8s patch leases", "k8s patch leases"];
    for (const [i, span] of allocates.slice(0, 3).entries()) {
      const children = childrenOf(spans, span).map((
        s,
      ) => [s.name, s.attributes["idalloc.outcome"]]);
      assert.deepEqual(
        [...children.slice(0, 2).map(String).sort(), String(children[2]), children.length],
        [
          ...[`k8s create leases,ok`, `${reference[i]},ok`].sort(),
          "k8s create ciliumidentities,ok",
          3,
        ],
      );
    }
    assert.equal(allocates[3].status.code, SpanStatusCode.ERROR);
    // As counted above: a dropped pooled connection, then refused ones.
    const outageErrors = childrenOf(spans, allocates[3]).map((s) => s.attributes["error.type"]);
    assert.ok(
      outageErrors.at(-1) === "StoreConnectionRefusedError" &&
        outageErrors.every((t) =>
          t === "StoreConnectionRefusedError" || t === "StoreUnavailableError"
        ),
      outageErrors.join(", "),
    );
    const [release] = spansNamed(spans, "idalloc.release");
    // The release drops the reference from the node's own object: one patch of a Lease.
    assert.deepEqual(childrenOf(spans, release).map((s) => s.name), ["k8s patch leases"]);
    const [gcSpan] = spansNamed(spans, "idalloc.gc");
    assert.ok(childrenOf(spans, gcSpan).length > 0, "GC's reads are its children");

    // Still down: the informer's watch broke and its retries are refused; so are the renewals.
    await eventually(async () => {
      const now = await sdk.collect();
      return sum(now, "idalloc.watch.reconnects", {
            ...BASE,
            "error.type": "StoreConnectionRefusedError",
          }) >= 1 && renewals(now, "failed", "StoreConnectionRefusedError") >= 1;
    }, "a refused watch retry and a refused renewal are counted");
    // A write behind the API server's back moves etcd's revision past the informer's version: the
    // restarted server's watch cache starts there and answers the informer's resume with 410.
    const raw = rawClient(cluster.etcd.endpoints);
    try {
      await raw.put("/idalloc-test/behind").value("1");
    } finally {
      raw.close();
    }
    await cluster.restart();
    // The watch's retries back off while the server is down (up to WATCH_RETRY_MAX_MS apart), and
    // a loaded machine restarts the server slowly: this counts, it does not time.
    await eventually(
      async () => relists(await sdk.collect(), "expired") >= 1,
      "the informer's re-list after 410 is counted, as expired",
      60_000,
    );
    m = await sdk.collect();
    assert.equal(relists(m, "initial"), 1, "the first list only");
    await eventually(
      async () => renewals(await sdk.collect(), "ok") > renewals(m, "ok"),
      "renewals are confirmed again once the API server is back",
    );
  },
});
