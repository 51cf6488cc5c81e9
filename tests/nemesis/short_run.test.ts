/**
 * A short nemesis run still tries every fault kind it can once, each garbage kind included: the
 * first round runs to its end even when the fault phase is already over (`--seconds 20` used to
 * inject 1 kind of 11). Garbage is planted in a real Deno KV store through its nemesis hooks; the
 * worker faults act on stand-in targets that record the signals (no worker processes here: the
 * scheduling is what is checked).
 */
import assert from "node:assert/strict";
import {
  type FaultContext,
  type FaultRecord,
  garbageTargets,
  runNemesis,
} from "../../nemesis/faults.ts";
import { kvNemesis, openKvStore } from "../../src/backends/kv/testing/nemesis.ts";
import { prng } from "../../src/testing/prng.ts";

/** Deno KV's garbage kinds: the store these runs plant in. */
const GARBAGE_KINDS = kvNemesis.garbageKinds;

async function shortRun(
  kinds: string[],
  garbage: readonly string[],
  overlapEveryMs?: readonly [number, number],
): Promise<FaultRecord[]> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-short-nemesis-" });
  await using store = await openKvStore({
    kind: "deno-kv",
    path: `${dir}/store.kv`,
    prefix: ["nemesis"],
    pollIntervalMs: 200,
    maxClockSkewMs: 0,
    resyncIntervalMs: 15_000,
  });
  const records: FaultRecord[] = [];
  const signals: string[] = [];
  const target = (slot: number) => ({
    node: `w${slot}`,
    inc: `w${slot}@1`,
    signal: (signal: string) => signals.push(signal) > 0,
  });
  const random = prng(7);
  const ctx: FaultContext = {
    random,
    store,
    storeFaults: kvNemesis.storeFaults ?? {},
    // A stall of the shortest kind: 2 s.
    timings: { leaseTtlMs: 1, syncIntervalMs: 1, gcIntervalMs: 1, callTimeoutMs: 1 },
    skewMs: 0,
    garbage,
    garbageTargets: garbageTargets(["k8s:app=a;"], { min: 256, max: 300 }, random),
    slots: 3,
    target,
    restart: (slot) => Promise.resolve(target(slot)),
    record: (f) => records.push(f),
    stopped: () => {},
    overlapEveryMs,
  };
  try {
    // The fault phase is over before it starts: only the first round runs.
    await runNemesis(ctx, kinds, Date.now());
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
  if (kinds.includes("kill")) assert.ok(signals.includes("SIGKILL"), signals.join());
  if (kinds.includes("stall")) assert.ok(signals.includes("SIGSTOP"), signals.join());
  return records;
}

function kindsTried(records: readonly FaultRecord[]): string[] {
  return records.map((r) => r.kind === "garbage" ? r.label : r.kind).sort();
}

Deno.test("nemesis: a short run tries every fault kind once, each garbage kind too", async () => {
  const records = await shortRun(["kill", "stall", "lease-revoke", "garbage"], GARBAGE_KINDS, [
    5,
    15,
  ]);
  assert.deepEqual(
    kindsTried(records),
    ["kill", "lease-revoke", "stall", ...GARBAGE_KINDS.map((g) => `garbage/${g}`)].sort(),
  );
});

Deno.test("nemesis: one fault at a time (the default), the first round runs whole too", async () => {
  const garbage: string[] = ["bad-ref", "empty-master"];
  const records = await shortRun(["lease-revoke", "garbage"], garbage);
  assert.deepEqual(kindsTried(records), [
    "garbage/bad-ref",
    "garbage/empty-master",
    "lease-revoke",
  ]);
});
