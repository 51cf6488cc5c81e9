// What the Kubernetes nemesis reads of a store, on plain objects as the API server lists them:
// identities that decode are masters, reference annotations are live exactly when the backend
// would judge them so (the node's own Lease, its epoch, its end plus the skew margin), everything
// else is counted as skipped, never as data; and the growth counts and bounds.
import assert from "node:assert/strict";
import { checkStore, STORE_CHECKS } from "../../nemesis/checks/store.ts";
import type { KubeObject } from "../../src/backends/k8s/client.ts";
import {
  checkK8sGrowth,
  k8sCounts,
  k8sSnapshot,
  nodeLeases,
} from "../../src/backends/k8s/testing/nemesis_read.ts";

const T = Date.parse("2026-11-26T12:00:00Z");
const SKEW = 500;

function identity(
  name: string,
  labels: Record<string, string>,
  annotations: Record<string, string> = {},
): KubeObject {
  return { metadata: { name, annotations, resourceVersion: "1" }, "security-labels": labels };
}

/** A node Lease renewed at `renewed` for `seconds`, named `name` (the node's own by default). */
function lease(
  node: string,
  epoch: string | undefined,
  renewed: number,
  seconds = 5,
  name = `idalloc-node-${node}`,
): KubeObject {
  return {
    metadata: {
      name,
      annotations: epoch === undefined ? {} : { "idalloc.io/epoch": epoch },
      resourceVersion: "1",
    },
    spec: {
      holderIdentity: node,
      renewTime: new Date(renewed).toISOString(),
      leaseDurationSeconds: seconds,
    },
  };
}

const web = { "k8s:app": "web" };
const db = { "k8s:app": "db" };

Deno.test("k8s snapshot: identities that decode are masters, references judged by their node's Lease", () => {
  const s = k8sSnapshot({
    identities: [
      identity("300", web, { "ref.idalloc.io/a": "ea", "ref.idalloc.io/b": "old" }),
      identity("301", { "idalloc:key": "x;/sub;" }, { "ref.idalloc.io/c": "ec" }),
    ],
    leases: [lease("a", "ea", T - 1_000), lease("b", "eb", T - 1_000), lease("c", "ec", T - 5_400)],
    now: T,
    skewMs: SKEW,
  });
  assert.deepEqual(s.masters, [{ id: 300, key: "k8s:app=web;" }, { id: 301, key: "x;/sub;" }]);
  assert.deepEqual(s.refs, [
    { key: "k8s:app=web;", node: "a", id: 300, live: true },
    // b's Lease carries another epoch: the reference is dead for everyone.
    { key: "k8s:app=web;", node: "b", id: 300, live: false },
    // c's Lease ended 400 ms ago: still within the skew margin, as the backend judges it.
    { key: "x;/sub;", node: "c", id: 301, live: true },
  ]);
  assert.equal(s.strictMasters, true);
  assert.deepEqual(s.skipped, {});
});

Deno.test("k8s snapshot: a lapsed Lease, a missing one and one without an epoch leave references dead", () => {
  const s = k8sSnapshot({
    identities: [identity("300", web, {
      "ref.idalloc.io/lapsed": "e1",
      "ref.idalloc.io/gone": "e2",
      "ref.idalloc.io/bare": "e3",
    })],
    leases: [lease("lapsed", "e1", T - 5_600), lease("bare", undefined, T)],
    now: T,
    skewMs: SKEW,
  });
  assert.deepEqual(s.refs.map((r) => [r.node, r.live]), [
    ["lapsed", false],
    ["gone", false],
    ["bare", false],
  ]);
});

Deno.test("k8s snapshot: a Lease copied under another name never keeps a node's references live", () => {
  const forged = lease("a", "ea", T, 3_600, "idalloc-node-nemesis-ghost-1");
  const s = k8sSnapshot({
    identities: [identity("300", web, { "ref.idalloc.io/a": "ea" })],
    leases: [lease("a", "ea", T - 60_000), forged],
    now: T,
    skewMs: SKEW,
  });
  assert.deepEqual(s.refs, [{ key: "k8s:app=web;", node: "a", id: 300, live: false }]);
  assert.deepEqual(s.skipped, { "node Lease not named as its holder's": 1 });
});

Deno.test("k8s snapshot: garbage is counted as skipped, never as a master or a reference", () => {
  const s = k8sSnapshot({
    identities: [
      identity("nemesis-ghost-1", web),
      identity("302", {}),
      identity("303", { "no-source": "x" }),
      identity("304", db, { "ref.idalloc.io/nemesis-ghost-2": "" }),
      identity("305", { "idalloc:key": "k".repeat(300_000) }),
    ],
    leases: [{ metadata: { name: "idalloc-node-x" }, spec: {} }],
    now: T,
    skewMs: SKEW,
  });
  assert.deepEqual(s.masters, [{ id: 304, key: "k8s:app=db;" }]);
  assert.deepEqual(s.refs, []);
  assert.deepEqual(s.skipped, {
    "identity not named by an ID": 1,
    "identity whose labels name no key": 2,
    "identity whose key is too large": 1,
    "reference annotation without a node or an epoch": 1,
    "node Lease without a holder": 1,
  });
});

Deno.test("k8s snapshot: the store checks hold two identities of one key to be a violation", () => {
  const s = k8sSnapshot({
    identities: [
      identity("300", web, { "ref.idalloc.io/a": "ea" }),
      identity("301", web),
      identity("302", db, { "ref.idalloc.io/a": "ea" }),
    ],
    leases: [lease("a", "ea", T)],
    now: T,
    skewMs: SKEW,
  });
  const holds = [{ node: "a", inc: "a@1", holds: { "k8s:app=web;": 300, "k8s:app=db;": 302 } }];
  const result = checkStore(s, holds);
  assert.deepEqual(result.violations.map((v) => v.check), [STORE_CHECKS.oneMaster]);
  assert.match(result.violations[0].message, /k8s:app=web; has masters 300, 301/);
  const single = k8sSnapshot({
    identities: [identity("300", web, { "ref.idalloc.io/a": "ea" }), identity("302", db)],
    leases: [lease("a", "ea", T)],
    now: T,
    skewMs: SKEW,
  });
  // a holds db → 302 but has no reference on it: the holds check says so.
  assert.deepEqual(checkStore(single, holds).violations.map((v) => v.check), [STORE_CHECKS.holds]);
});

Deno.test("k8s node Leases: one per node, by its own name", () => {
  const leases = nodeLeases([lease("a", "e", T), lease("w1", "e", T, 5, "idalloc-node-other")]);
  assert.deepEqual([...leases.keys()], ["a"]);
  assert.equal(leases.get("a")?.expiresAt, T + 5_000);
});

Deno.test("k8s growth counts: masters, damage, references live and dead, marks, claims, Leases", () => {
  const claim = (id?: string, key?: string): KubeObject => ({
    metadata: {
      name: "idalloc-key-x",
      labels: id === undefined ? {} : { "idalloc.io/id": id },
      annotations: key === undefined ? {} : { "idalloc.io/key": key },
    },
  });
  const counts = k8sCounts({
    identities: [
      identity("300", web, {
        "ref.idalloc.io/g": "e",
        "io.cilium.heartbeat": "2026-11-26T12:00:00Z",
      }),
      identity("301", db, { "ref.idalloc.io/gone": "e" }),
      identity("x", db),
    ],
    leases: [lease("g", "e", T)],
    claims: [claim("300", "k8s:app=web;"), claim()],
    now: T,
    skewMs: SKEW,
  });
  assert.deepEqual(counts, {
    id: 2,
    damaged: 1,
    ref: 2,
    "ref (dead)": 1,
    marked: 1,
    claim: 1,
    lease: 1,
  });
});

Deno.test("k8s growth bounds: claims by the key set, references by the window, one Lease", () => {
  const failures = (counts: Record<string, number>) => {
    const out: string[] = [];
    checkK8sGrowth({ counts }, { keys: 1_000, window: 50 }, (what) => out.push(what));
    return out;
  };
  assert.deepEqual(failures({ id: 900, claim: 1_000, ref: 100, "ref (dead)": 50, lease: 1 }), []);
  assert.deepEqual(failures({ claim: 1_001, ref: 101, "ref (dead)": 51, lease: 2 }), [
    "1001 key claims for 1000 keys",
    "101 references for 50 held keys",
    "51 dead references",
    "2 node Leases for one node",
  ]);
});
