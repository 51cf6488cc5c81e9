/**
 * Metrics and traces on a Deno KV file shared by two nodes, read back through the OpenTelemetry
 * SDK: group commit, an existing key found by the second node, the watch's lag, releases, GC and
 * identity counts by scope. In a file of its own: the global providers are process-wide.
 */
import assert from "node:assert/strict";
import { Allocator, DenoKvBackend } from "../../../mod.ts";
import { IdentityAllocator, Labels } from "../../../src/identity/mod.ts";
import { eventually } from "../../_support/eventually.ts";
import { childrenOf, installSdk, points, spansNamed, sum } from "../../_support/telemetry.ts";

const A = { "idalloc.backend": "deno-kv", "idalloc.prefix": "tel", "idalloc.node": "a" };
const B = { ...A, "idalloc.node": "b" };

async function withKv(fn: (kv: Deno.Kv) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-telemetry-" });
  try {
    using kv = await Deno.openKv(`${dir}/t.kv`);
    await fn(kv);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("telemetry on Deno KV: group commit, two nodes, watch lag, release and GC", () =>
  withKv(async (kv) => {
    await using sdk = installSdk();
    const options = { prefix: ["tel"], pollIntervalMs: 20 };
    await using a = await Allocator.open(new DenoKvBackend(kv, { ...options, node: "a" }), {
      max: 1000,
    });
    await using b = await Allocator.open(new DenoKvBackend(kv, { ...options, node: "b" }), {
      max: 1000,
    });
    await Promise.all([a.waitForInitialSync(), b.waitForInitialSync()]);

    // Three new keys at once: the first commit goes alone, the other two share the next one.
    const created = await Promise.all(["x", "y", "z"].map((k) => a.allocate(k)));
    assert.deepEqual(created.map((r) => r.isNew), [true, true, true]);
    while (b.status().cachedIds < 3) await new Promise((r) => setTimeout(r, 10));
    assert.equal((await b.allocate("x")).isNew, false); // existing, with the cache's hint
    assert.equal((await a.allocate("x")).firstUse, false); // cached
    assert.deepEqual(await b.release("x"), { lastUse: true });
    await a.runGc();
    await a.sync();

    const m = await sdk.collect();
    assert.equal(sum(m, "idalloc.allocations", { ...A, "idalloc.outcome": "new" }), 3);
    assert.equal(sum(m, "idalloc.allocations", { ...A, "idalloc.outcome": "cached" }), 1);
    assert.equal(sum(m, "idalloc.allocations", { ...B, "idalloc.outcome": "existing" }), 1);
    assert.equal(sum(m, "idalloc.allocations", { "idalloc.outcome": "failed" }), 0);
    // A shared commit is one round trip for each of its members.
    const trips = points(m, "idalloc.allocation.round_trips", { ...A, "idalloc.outcome": "new" });
    assert.deepEqual(trips.map((p) => [p.value, p.sum]), [[3, 3]]);
    const existing = points(m, "idalloc.allocation.round_trips", { ...B });
    assert.deepEqual(existing.map((p) => [p.value, p.sum]), [[1, 1]], "one commit, no read");
    const batches = points(m, "idalloc.store.batch.size", {
      ...A,
      "idalloc.store.operation": "commit",
    });
    assert.deepEqual(batches.map((p) => [p.value, p.sum]), [[2, 3]], "batches of 1 and 2");
    assert.equal(
      sum(m, "idalloc.store.operations", {
        ...A,
        "idalloc.store.operation": "commit",
        "idalloc.outcome": "ok",
      }),
      3,
      "the lease record, then two commits for three keys",
    );
    assert.equal(sum(m, "idalloc.releases", { ...B, "idalloc.outcome": "last_use" }), 1);
    assert.equal(sum(m, "idalloc.gc.runs", { ...A, "idalloc.outcome": "ok" }), 1);
    assert.equal(sum(m, "idalloc.watch.relists", { ...A, "idalloc.reason": "initial" }), 1);
    // b learnt a's three masters from the change feed, each dated by a's clock.
    const lag = points(m, "idalloc.watch.lag", B);
    assert.equal(lag.length, 1);
    assert.equal(lag[0].value, 3);
    assert.ok(lag[0].sum! >= 0 && lag[0].sum! < 30, `lag sum ${lag[0].sum}`);
    assert.equal(sum(m, "idalloc.keys.held", A), 3);
    assert.equal(sum(m, "idalloc.keys.held", B), 0);
    assert.equal(sum(m, "idalloc.ids.free", A), 997);

    const spans = sdk.spans();
    const allocates = spansNamed(spans, "idalloc.allocate");
    assert.equal(
      allocates.length,
      4,
      "three new keys and one existing; no span for the cached hit",
    );
    const commits = allocates.flatMap((s) => childrenOf(spans, s)).map((s) => s.name);
    // The shared commit is traced once, under its first member.
    assert.deepEqual(commits, ["deno-kv commit", "deno-kv commit", "deno-kv commit"]);
    const [sync] = spansNamed(spans, "idalloc.sync");
    assert.deepEqual(
      [
        sync.attributes["idalloc.reason"],
        sync.attributes["idalloc.keys"],
        sync.attributes["idalloc.outcome"],
      ],
      ["requested", 3, "ok"],
    );
    assert.ok(childrenOf(spans, sync).some((s) => s.name === "deno-kv read"), "ensure reads");
  }));

Deno.test("telemetry: identity counts by scope", () =>
  withKv(async (kv) => {
    await using sdk = installSdk();
    const backend = new DenoKvBackend(kv, { prefix: ["ids"], node: "n" });
    await using identities = await IdentityAllocator.open(backend);
    await identities.waitForInitialSync();
    await identities.allocate(Labels.parse(["k8s:app=web"]));
    await identities.allocate(Labels.parse(["cidr:10.0.0.0/8"]));
    const m = await sdk.collect();
    const scope = (s: string) =>
      sum(m, "idalloc.identities", { "idalloc.prefix": "ids", "idalloc.identity.scope": s });
    assert.equal(scope("local"), 1);
    assert.equal(scope("remote-node"), 0);
    assert.equal(scope("reserved"), [...identities.reserved].length);
    assert.ok(scope("reserved") > 10);
    // The global identity reaches the cache through the store's change feed.
    await eventually(async () => {
      m.splice(0, m.length, ...await sdk.collect());
      return scope("global") === 1;
    }, "the global identity is counted");
    await identities.close();
    // Closed: its gauges are no longer reported (a fresh reader sees nothing of it).
    await sdk[Symbol.asyncDispose]();
    await using fresh = installSdk();
    assert.deepEqual(points(await fresh.collect(), "idalloc.identities"), []);
    assert.deepEqual(points(await fresh.collect(), "idalloc.keys.held"), []);
  }));
