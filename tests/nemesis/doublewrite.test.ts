// The double-write nemesis without a server: `--backend doublewrite` parses beside the registry's
// backends (never a `--store` scheme, never part of `all`), offers every store fault of both
// sides, makes its migration step by the seed, and its snapshot and checks judge each side and the
// drift between them (plain snapshots, as the sides' harnesses read them).
import assert from "node:assert/strict";
import { BACKEND_KINDS, FAULT_KINDS, faultKindsOf, RUN_KINDS } from "../../nemesis/backends.ts";
import { loadNemesisHooks } from "../../nemesis/composed.ts";
import { checkSides, SIDES_CHECK } from "../../nemesis/checks/sides.ts";
import { type LiveHolds, STORE_CHECKS } from "../../nemesis/checks/store.ts";
import { faultsOf, minSeconds, NemesisUsageError, parseOptions } from "../../nemesis/config.ts";
import { backendOfKind, backendOfStore, BACKENDS } from "../../src/backends/registry.ts";
import { harness } from "../../src/backends/doublewrite/testing/harness.ts";
import {
  bothSnapshots,
  DoubleWriteNemesisStore,
} from "../../src/backends/doublewrite/testing/nemesis_store.ts";
import { migrationOf } from "../../src/backends/doublewrite/testing/nemesis_spec.ts";
import type { NemesisStore, StoreSnapshot } from "../../src/testing/nemesis.ts";

Deno.test("nemesis doublewrite: a backend of the nemesis beside the registry's, not a store scheme", () => {
  assert.deepEqual(BACKEND_KINDS, [...BACKENDS.map((b) => b.kind), "doublewrite"]);
  // `all` is the registry's backends: the composed store runs only when named.
  assert.deepEqual(RUN_KINDS, BACKENDS.map((b) => b.kind));
  assert.deepEqual(parseOptions([])!.runs.map((r) => r.backend), RUN_KINDS);
  assert.equal(backendOfKind("doublewrite"), undefined);
  assert.equal(backendOfStore("doublewrite://127.0.0.1:2379"), undefined);
});

Deno.test("nemesis doublewrite: the options, the least seconds, and every fault of both sides", () => {
  const o = parseOptions(["--backend", "doublewrite", "--seed", "4"])!;
  assert.deepEqual(o.runs.map((r) => r.backend), ["doublewrite"]);
  assert.equal(o.totalSeconds, minSeconds("doublewrite"));
  assert.ok(minSeconds("doublewrite") > minSeconds("k8s"), "both stores start and are read");
  // Every fault some backend offers (etcd's members, the API server and its etcd), but garbage.
  assert.deepEqual(faultKindsOf("doublewrite"), FAULT_KINDS.filter((k) => k !== "garbage"));
  // No garbage: each side's own run plants it.
  assert.ok(!faultsOf("doublewrite", o).includes("garbage"));
  const narrow = parseOptions([
    "--backend",
    "doublewrite",
    "--seconds",
    "120",
    "--faults",
    "kill,stall,apiserver-restart,outage,garbage",
  ])!;
  assert.equal(faultsOf("doublewrite", narrow), "kill, stall, apiserver-restart, outage");
  assert.throws(
    () => parseOptions(["--backend", "doublewrite", "--cilium", "2"]),
    (err: unknown) =>
      err instanceof NemesisUsageError && /^--cilium needs --backend/.test(err.message),
  );
  assert.throws(
    () => parseOptions(["--backend", "doublewrite", "--seconds", "40"]),
    (err: unknown) =>
      err instanceof NemesisUsageError && /too short for doublewrite/.test(err.message),
  );
});

Deno.test("nemesis doublewrite: a child process finds the composed harness by the spec's kind", async () => {
  const hooks = await loadNemesisHooks("doublewrite");
  assert.equal(hooks, harness.nemesis);
  assert.equal(harness.kind, "doublewrite");
  // The CRD side's 5 s lease on the kvstore's timings.
  const timings = {
    leaseTtlMs: 3_000,
    syncIntervalMs: 2_000,
    gcIntervalMs: 1_000,
    callTimeoutMs: 10_000,
  };
  assert.equal(hooks.timings("default", timings).leaseTtlMs, 5_000);
});

/** A side's snapshot as its harness reads it. */
function side(
  masters: { id: number; key: string }[],
  refs: StoreSnapshot["refs"] = [],
  strictMasters = false,
): StoreSnapshot {
  return { at: 1, masters, refs, strictMasters, skipped: {} };
}

/** A side store that only has a snapshot and a fault (no server: the routing is what is tested). */
function sideStore(kind: string, snapshot: StoreSnapshot, done: string[]): NemesisStore {
  return {
    kind,
    spec: { kind },
    skewMs: kind === "k8s" ? 500 : 0,
    snapshot: () => Promise.resolve(snapshot),
    plant: () => Promise.reject(new Error("no garbage")),
    revokeLease: (node) => Promise.resolve(`${kind} revoked ${node}`),
    counts: () => Promise.resolve({ id: 1 }),
    fileBytes: () => Promise.resolve(0),
    injectFault: (fault: string) => {
      done.push(`${kind} ${fault}`);
      return Promise.resolve({ detail: `${fault} done` });
    },
    [Symbol.asyncDispose]: () => Promise.resolve(void done.push(`${kind} closed`)),
  } as NemesisStore;
}

Deno.test("nemesis doublewrite: the migration step by the seed, faults and revocations by side", async () => {
  assert.deepEqual(migrationOf(0), { from: "doublewrite-readkvstore", to: "doublewrite-readcrd" });
  assert.deepEqual(migrationOf(3), { from: "doublewrite-readcrd", to: "doublewrite-readkvstore" });
  const done: string[] = [];
  const step = migrationOf(8);
  const store = new DoubleWriteNemesisStore(
    { kind: "doublewrite", mode: step.to, kvstore: { kind: "etcd" }, crd: { kind: "k8s" } },
    {
      kvstore: sideStore("etcd", side([]), done),
      crd: sideStore("k8s", side([]), done),
    },
    {
      faults: {
        outage: { side: "kvstore", label: "kvstore: etcd outage" },
        "apiserver-restart": { side: "crd", label: "crd: API-server restart" },
      },
      leaving: step.from,
    },
  );
  // First incarnations in the mode left, every restart in the mode entered.
  assert.deepEqual(store.nodeSpec(1, 0), {
    spec: { ...store.spec, mode: "doublewrite-readkvstore" },
    label: "doublewrite-readkvstore",
  });
  assert.equal(store.nodeSpec(1, 1).label, "doublewrite-readcrd");
  assert.equal(store.nodeSpec(2, 5).spec.mode, "doublewrite-readcrd");
  assert.equal(store.skewMs, 500);
  assert.equal((await store.injectFault("outage", () => 0)).detail, "kvstore: outage done");
  assert.equal(
    (await store.injectFault("apiserver-restart", () => 0)).detail,
    "crd: apiserver-restart done",
  );
  await assert.rejects(store.injectFault("watch-expiry", () => 0), /no store fault/);
  assert.equal(await store.revokeLease("w1", () => 0.1), "kvstore: etcd revoked w1");
  assert.equal(await store.revokeLease("w1", () => 0.9), "crd: k8s revoked w1");
  assert.deepEqual(await store.counts(), { "kvstore id": 1, "crd id": 1 });
  await store[Symbol.asyncDispose]();
  assert.deepEqual(done, ["etcd outage", "k8s apiserver-restart", "k8s closed", "etcd closed"]);
});

Deno.test("nemesis doublewrite: each side's store checks, and the drift that breaks a promise", () => {
  const ref = (key: string, node: string, id: number) => ({ key, node, id, live: true });
  const kvstore = side(
    [{ id: 300, key: "a" }, { id: 301, key: "b" }, { id: 302, key: "c" }, { id: 303, key: "d" }],
    [ref("a", "w0", 300), ref("d", "w1", 303)],
  );
  const crd = side(
    [{ id: 300, key: "a" }, { id: 301, key: "x" }, { id: 310, key: "c" }, { id: 320, key: "e" }],
    [ref("a", "w0", 300)],
    true,
  );
  const snapshot = bothSnapshots(kvstore, crd);
  assert.equal(snapshot.masters.length, 8);
  assert.deepEqual(
    snapshot.drift?.map((d) => [d.kind, d.broken, d.ids]),
    [
      ["labels-differ", true, [301]],
      ["key-split", true, [302, 310]],
      ["kvstore-only", false, [303]],
      ["crd-only", false, [320]],
    ],
  );
  const holders: LiveHolds[] = [
    { node: "w0", inc: "w0@1", holds: { a: 300 } },
    // Held on the kvstore only: the CRD side fails the holds check.
    { node: "w1", inc: "w1@2", holds: { d: 303 } },
  ];
  const result = checkSides(snapshot, holders, new Set());
  assert.deepEqual(result.drift, {
    "labels-differ": 1,
    "key-split": 1,
    "kvstore-only": 1,
    "crd-only": 1,
  });
  assert.deepEqual(
    result.violations.map((v) => [v.check, v.message.split(" ")[0]]),
    [
      [STORE_CHECKS.holds, "crd:"],
      [SIDES_CHECK, "labels-differ:"],
      [SIDES_CHECK, "key-split:"],
    ],
  );
  // Planted garbage is not drift of idalloc's making.
  const planted = checkSides(snapshot, [], new Set([301, 302]));
  assert.deepEqual(planted.drift, { "kvstore-only": 1, "crd-only": 1 });
  assert.deepEqual(planted.violations, []);
});
