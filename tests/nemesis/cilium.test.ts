// The Cilium worker's JSON lines as nemesis records (no binary needed), and --cilium's options.
import assert from "node:assert/strict";
import {
  CILIUM_BINARY_ENV,
  CILIUM_OPS,
  ciliumBinary,
  ciliumUnavailable,
  convertCiliumOutput,
  errorName,
} from "../../nemesis/cilium.ts";
import { checkHistory, SPLIT_CHECK } from "../../nemesis/checks/history.ts";
import { parseOptions, workloadFor } from "../../nemesis/config.ts";
import { recordSchema } from "../../nemesis/records.ts";

const who = { node: "c1", inc: "c1@c2" };
const lines = (...objects: object[]) =>
  objects.map((o) => JSON.stringify({ node: "c1", ...o })).join("\n") + "\n";

Deno.test("cilium output: calls become records, held from the worker's own counts", () => {
  const out = lines(
    { op: "get", key: "k8s:app=k3;", id: 0, t0: 1000.4, t1: 1001.2 },
    { op: "allocate", key: "k8s:app=k3;", id: 7, t0: 1002.7, t1: 1010.1 },
    { op: "allocate", key: "k8s:app=k3;", id: 7, t0: 1011, t1: 1011.5 },
    { op: "get", key: "k8s:app=k3;", id: 7, t0: 1012, t1: 1012.3 },
    { op: "release-start", key: "k8s:app=k3;", id: 7, t0: 1013, last: false },
    { op: "release", key: "k8s:app=k3;", id: 7, t0: 1013, t1: 1013.9 },
    { op: "release-start", key: "k8s:app=k3;", id: 7, t0: 1014.5, last: true },
    { op: "release", key: "k8s:app=k3;", id: 7, t0: 1014.5, t1: 1016 },
    { op: "get", key: "k8s:app=k3;", id: 9, t0: 1017, t1: 1018 },
  );
  const c = convertCiliumOutput(out, who);
  assert.deepEqual(c.bad, []);
  for (const r of c.records) assert.ok(recordSchema.safeParse(r).success, JSON.stringify(r));
  const brief = c.records.map((r) =>
    r.t === "call" && r.ok
      ? [r.op, r.id ?? null, r.held, r.start, r.end, r.lastUse ?? null]
      : ["?", r.t]
  );
  assert.deepEqual(brief, [
    // Cilium's NoID (0) is no answer; windows only widen (start floored, end ceiled).
    ["get", null, false, 1000, 1002, null],
    ["allocate", 7, false, 1002, 1011, null],
    ["allocate", 7, true, 1011, 1012, null],
    ["get", 7, true, 1012, 1013, null],
    ["release", null, true, 1013, 1014, false],
    ["release", null, true, 1014, 1016, true],
    ["get", 9, false, 1017, 1018, null],
  ]);
  assert.ok(c.records.every((r) => r.t === "call" && r.node === "c1" && r.inc === "c1@c2"));
  assert.equal(c.outcomes.get(CILIUM_OPS.allocate)?.ok, 2);
  assert.equal(c.outcomes.get(CILIUM_OPS.release)?.ok, 2);
  assert.equal(c.outcomes.get(CILIUM_OPS.get)?.ok, 3);
});

Deno.test("cilium output: errors, the held reply, and lines that do not fit", () => {
  const out = lines(
    { op: "allocate", key: "k8s:app=k1;", id: 4, t0: 1, t1: 2 },
    {
      op: "error",
      t0: 3,
      t1: 4,
      err: "unable to create secondary key 'k8s:app=k1;': lease 12 gone",
    },
    { op: "release-start", key: "k8s:app=k1;", id: 4, t0: 5, last: true },
    { op: "error", t0: 5, t1: 6, err: "context deadline exceeded" },
    { held: { "k8s:app=k2;": 11 } },
    { op: "release", key: "k8s:app=k9;", id: 1, t0: 7, t1: 8 },
  ) + "{not json\n";
  const c = convertCiliumOutput(out, who);
  // A failed allocate or get prints neither op nor key: counted, not recorded.
  assert.deepEqual(
    [...c.outcomes.get(CILIUM_OPS.unknown)!.errors],
    [["unable to create secondary key", 1]],
  );
  assert.deepEqual([...c.outcomes.get(CILIUM_OPS.release)!.errors], [[
    "context deadline exceeded",
    1,
  ]]);
  const failed = c.records.find((r) => r.t === "call" && !r.ok);
  assert.ok(failed?.t === "call" && !failed.ok);
  assert.equal(failed.op, "release");
  assert.equal(failed.key, "k8s:app=k1;");
  assert.equal(failed.typed, false);
  assert.deepEqual(c.held, { "k8s:app=k2;": 11 });
  // A release without its release-start, and a torn line.
  assert.equal(c.bad.length, 2);
  assert.equal(
    errorName("failed to allocate ID 42 after 10 retries"),
    "failed to allocate ID N after N retries",
  );
});

Deno.test("cilium output: the history judges a Cilium node's answers with idalloc's", () => {
  // w0 (idalloc) holds k48 as 23; Cilium node c1 allocates and reads it as 34 meanwhile.
  const idalloc = [
    { start: 100, end: 110, id: 23 },
    { start: 300, end: 310, id: 23 },
  ].map((a) => ({
    t: "call" as const,
    node: "w0",
    inc: "w0@1",
    op: "allocate" as const,
    key: "k8s:app=k48;",
    ok: true as const,
    held: false,
    ...a,
  }));
  const cilium = convertCiliumOutput(
    lines(
      { op: "allocate", key: "k8s:app=k48;", id: 34, t0: 150, t1: 160 },
      { op: "get", key: "k8s:app=k48;", id: 34, t0: 250, t1: 251 },
    ),
    who,
  );
  const h = checkHistory([...idalloc, ...cilium.records], {
    silentChangeAllowed: new Set([who.inc]),
  });
  assert.equal(h.splits.length, 1);
  assert.equal(h.splits[0].check, SPLIT_CHECK);
  assert.match(h.splits[0].message, /k8s:app=k48; was answered as 23 by w0 and as 34 by c1/);
});

Deno.test("cilium: where the binary is looked for, and the message when it is absent", () => {
  assert.equal(ciliumBinary({ [CILIUM_BINARY_ENV]: "/x/interop116" }), "/x/interop116");
  assert.equal(ciliumBinary({ CILIUM_WORK: "/w" }), "/w/bin/interop116");
  assert.equal(ciliumBinary({ HOME: "/h" }), "/h/.cache/cilium-node/bin/interop116");
  const why = ciliumUnavailable({ CILIUM_WORK: "/nonexistent-cilium-work" });
  assert.match(why ?? "", /not built.*build\.sh --v116/);
});

Deno.test("cilium: --cilium needs etcd, counts toward three nodes, and moves to Cilium's keys", () => {
  const o = parseOptions(["--backend", "etcd", "--nodes", "2", "--cilium", "2"]);
  assert.equal(o?.cilium, 2);
  assert.equal(o?.nodes, 2);
  assert.throws(() => parseOptions(["--cilium", "2"]), /--cilium needs --backend etcd/);
  assert.throws(() => parseOptions(["--backend", "etcd", "--nodes", "2"]), /3 or more nodes/);
  assert.equal(parseOptions([])?.cilium, 0);
  const w = workloadFor("keyside", "etcd", true);
  assert.equal(w.plainKeys.length, 60);
  assert.equal(w.plainKeys[48], "k8s:app=k48;");
  assert.ok(w.ranked);
  assert.deepEqual(w.plainRange, { min: 1, max: 80 });
});

Deno.test("cilium: --cilium takes Kubernetes too (CRD mode), whose store is then set up for Cilium", () => {
  const o = parseOptions(["--backend", "k8s", "--cilium", "2"]);
  assert.equal(o?.cilium, 2);
  assert.throws(
    () => parseOptions(["--backend", "deno-kv", "--cilium", "2"]),
    /--cilium needs --backend etcd or k8s/,
  );
  const w = workloadFor("default", "k8s", true);
  assert.equal(w.cilium, true, "the run's store is told Cilium nodes join");
  assert.equal(w.plainKeys[3], "k8s:app=k3;");
  assert.equal(workloadFor("default", "k8s").cilium, undefined);
});
