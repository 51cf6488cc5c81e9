// Three idalloc nodes — two in this process, one in a child process — race on 200 new keys on a
// real API server: every key gets one identity in the store, every node answers it, and exactly
// one node created it (the key claims: idalloc nodes never make two identities for one key).
import assert from "node:assert/strict";
import { ScriptProcess } from "../../_support/script_process.ts";
import { fixture, k8sTest } from "./_helpers.ts";
import { allocateAll, raceKeys, type RaceResult } from "./_race.ts";

const CHILD = new URL("./_race_child.ts", import.meta.url).pathname;
const KEYS = 200;

k8sTest(
  "three nodes racing on 200 new keys make one identity per key, and agree on it",
  async () => {
    await using fx = await fixture();
    const kubeconfig = await fx.cluster.kubeconfig("admin", { namespace: fx.namespace });
    await using child = new ScriptProcess(
      CHILD,
      [kubeconfig, "c", fx.group, fx.namespace, String(KEYS)],
      { stdin: true },
    );
    const ready = await child.nextLine();
    assert.equal(ready, JSON.stringify({ ready: true }), child.stderr);
    const a = await fx.allocator("a", { maxAttempts: 64 });
    const b = await fx.allocator("b", { maxAttempts: 64 });
    await Promise.all([a.waitForInitialSync(), b.waitForInitialSync()]);
    const keys = raceKeys(KEYS);
    child.closeStdin();
    const results: RaceResult[] = await Promise.all([
      allocateAll(a, keys),
      allocateAll(b, keys),
      child.nextLine().then((line) => JSON.parse(line ?? "null")),
    ]);
    await child.success("the child node");
    for (const key of keys) {
      const ids = results.map((r) => r.ids[key]);
      assert.ok(ids.every((id) => id === ids[0]), `${key}: ${ids}`);
    }
    const creators = results.flatMap((r) => r.created).sort();
    assert.deepEqual(creators, [...keys].sort(), "each key created exactly once");
    const byKey = new Map<string, number[]>();
    for (const r of await fx.records()) byKey.set(r.key, [...byKey.get(r.key) ?? [], r.id]);
    assert.equal(byKey.size, KEYS);
    for (const [key, ids] of byKey) assert.equal(ids.length, 1, `${key} has identities ${ids}`);
  },
);
