/**
 * A 3-member etcd cluster on loopback: allocation keeps working when a follower dies and when
 * the leader dies (after re-election), beside a Cilium node (a protocol double) allocating the
 * same keys, and no key ever gets two IDs.
 */
import assert from "node:assert/strict";
import { Allocator } from "../../../mod.ts";
import { CiliumDouble } from "../../_support/cilium_double.ts";
import { startEtcd } from "../../../src/backends/etcd/testing/cluster.ts";
import { assertOneIdPerKey, deadline, etcdTest, namespace } from "./_helpers.ts";

/** Cilium's `Allocate`, also retried across a member's death (Cilium's client fails over). */
async function ciliumAllocate(cilium: CiliumDouble, key: string): Promise<number> {
  const end = Date.now() + 30_000;
  for (;;) {
    try {
      return await cilium.allocate(key, () => 256 + Math.floor(Math.random() * 65_000));
    } catch (err) {
      if (Date.now() > end) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

const OPTIONS = {
  min: 256,
  max: 65_535,
  leaseTtlMs: 5_000,
  maxAttempts: 64,
  backoff: { initialMs: 10, maxMs: 200, factor: 2 },
};

etcdTest(
  "3 members: follower and leader killed, allocation goes on beside a Cilium node, one ID per key",
  async () => {
    await using etcd = await startEtcd({ members: 3 });
    await using ns = await namespace(etcd);
    const [a, c] = await Promise.all([ns.backend("node-a"), ns.backend("node-c")]);
    await using alloc1 = await Allocator.open(a, OPTIONS);
    await using alloc2 = await Allocator.open(c, OPTIONS);
    // A Cilium node races on the same keys through the same members, by Cilium's locked protocol.
    await using cilium = await CiliumDouble.start(ns.raw, ns.prefix, "cilium-a");
    const ids = new Map<string, number>();

    async function allocateBoth(batch: string): Promise<void> {
      const keys = Array.from({ length: 40 }, (_, i) => `k8s:batch=${batch};k8s:i=${i};`);
      const [r1, r2, r3] = await Promise.all([
        Promise.all(keys.map((k) => alloc1.allocate(k, { signal: deadline(30_000) }))),
        Promise.all(keys.map((k) => alloc2.allocate(k, { signal: deadline(30_000) }))),
        Promise.all(keys.map((k) => ciliumAllocate(cilium, k))),
      ]);
      for (const [i, k] of keys.entries()) {
        assert.equal(r1[i].id, r2[i].id, `both nodes agree on ${k}`);
        assert.equal(r3[i], r1[i].id, `the Cilium node agrees on ${k}`);
        ids.set(k, r1[i].id);
      }
    }

    // Each phase names itself in a failure, with how long it ran.
    const phase = async <T>(name: string, fn: () => Promise<T>): Promise<T> => {
      const start = performance.now();
      try {
        return await fn();
      } catch (err) {
        throw new Error(
          `phase '${name}' failed after ${Math.round(performance.now() - start)} ms`,
          {
            cause: err,
          },
        );
      }
    };
    await phase("allocate, healthy", () => allocateBoth("healthy"));

    const leader = await phase("find leader", () => etcd.leader());
    const follower = [0, 1, 2].find((i) => i !== leader)!;
    await phase("kill follower", () => etcd.kill(follower));
    await phase("allocate, follower down", () => allocateBoth("follower-down"));

    await phase("restart follower", () => etcd.restart(follower));
    const leader2 = await phase("find leader again", () => etcd.leader());
    await phase("kill leader", () => etcd.kill(leader2));
    // Waits for the re-election among the two members left.
    const leader3 = await phase("re-election", () => etcd.leader());
    assert.notEqual(leader3, leader2);
    await phase("allocate, leader down", () => allocateBoth("leader-down"));

    // Earlier keys still resolve to their IDs on both nodes.
    for (const [k, id] of ids) {
      assert.equal((await alloc1.allocate(k)).id, id);
      assert.equal((await alloc2.allocate(k)).id, id);
    }

    // No key has two IDs and no ID two keys, read from the store itself.
    const stored = await assertOneIdPerKey(ns);
    assert.deepEqual(stored, ids);
    assert.equal(new Set(ids.values()).size, ids.size, "no ID shared by two keys");
  },
);
