// The double-write nemesis harness on its real stores (a private 3-member etcd and a private
// kube-apiserver, as a run starts them): a node of each mode of the run's migration step opens
// through the hooks as a worker does, both agree on every ID, the snapshot reads both sides with
// no drift and passes each side's store checks, and a fault of each side goes to that side and
// leaves both writable. Skipped (loudly) without etcd or kube-apiserver.
import assert from "node:assert/strict";
import { Allocator } from "../../mod.ts";
import { checkSides } from "../../nemesis/checks/sides.ts";
import { CLOCK_SKEW_MS, TIMINGS } from "../../nemesis/config.ts";
import { harness } from "../../src/backends/doublewrite/testing/harness.ts";
import { prng } from "../../src/testing/prng.ts";
import { eventually } from "../_support/eventually.ts";

const KEYS = ["k8s:app=svc-1;", "k8s:app=svc-2;", "k8s:app=svc-2;/sub;", "k8s:app=svc-3;"];

Deno.test({
  name: "doublewrite harness: both modes of a migration step on both real stores, a fault of each",
  ignore: harness.unavailable() !== undefined,
  async fn() {
    const hooks = harness.nemesis;
    const dir = await Deno.makeTempDir({ prefix: "idalloc-dw-harness-" });
    const timings = hooks.timings("default", TIMINGS);
    // Seed 2: toward the CRDs.
    await using store = await hooks.startRun(dir, {
      name: "default",
      timings,
      clockSkewMs: CLOCK_SKEW_MS,
      seed: 2,
    });
    const leaving = store.nodeSpec!(0, 0);
    const entering = store.nodeSpec!(1, 1);
    assert.deepEqual(
      [leaving.label, entering.label],
      ["doublewrite-readkvstore", "doublewrite-readcrd"],
    );
    await using w0 = await hooks.openBackend(leaving.spec, "w0");
    await using w1 = await hooks.openBackend(entering.spec, "w1");
    const options = { min: 256, max: 575, leaseTtlMs: timings.leaseTtlMs };
    await using a0 = await Allocator.open(w0.backend, options);
    await using a1 = await Allocator.open(w1.backend, options);
    const held = async () => {
      const ids: Record<string, number> = {};
      for (const [i, key] of KEYS.entries()) {
        // Each key first allocated by one mode, then joined by the other.
        const [first, second] = i % 2 === 0 ? [a0, a1] : [a1, a0];
        ids[key] = (await first.allocate(key)).id;
        assert.equal((await second.allocate(key)).id, ids[key], key);
      }
      return ids;
    };
    const ids = await held();
    /** Each side's store checks and the drift across them, as the run judges them. */
    const judged = async () => {
      const holds = { ...ids };
      return checkSides(await store.snapshot(), [
        { node: "w0", inc: "w0@1", holds },
        { node: "w1", inc: "w1@2", holds },
      ], new Set());
    };
    const judge = async () => {
      const result = await judged();
      assert.deepEqual(result.violations, []);
      assert.deepEqual(result.drift, {});
    };
    await judge();

    const random = prng(5);
    const kv = await store.injectFault!("kill-follower", random);
    assert.match(kv.detail, /^kvstore: SIGKILL member \d, down \d+ ms$/);
    const crd = await store.injectFault!("apiserver-restart", random);
    assert.match(crd.detail, /^crd: SIGKILL kube-apiserver, down \d+ ms/);
    assert.match(await store.revokeLease("w0", () => 0.2), /^kvstore: revoked w0's lease/);
    // Both sides serve again: a new key in each mode, the held ones unchanged.
    for (const [alloc, key] of [[a0, "k8s:app=svc-9;"], [a1, "k8s:app=svc-8;"]] as const) {
      ids[key] = (await alloc.allocate(key, { signal: AbortSignal.timeout(60_000) })).id;
      assert.equal((await (alloc === a0 ? a1 : a0).allocate(key)).id, ids[key]);
    }
    for (const key of KEYS) assert.equal(await a1.get(key), ids[key], key);
    // After the revoked lease's replacement w0's references on the kvstore are written again.
    await eventually(
      async () => (await judged()).violations.length === 0,
      "w0's kvstore references are back",
      30_000,
    );
    await judge();
  },
});
