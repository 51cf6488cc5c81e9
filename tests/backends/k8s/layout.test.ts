// The Kubernetes layout on plain data: the key encoding rule (label sets as their map, any other
// key under `idalloc:key`), Cilium's label sanitising, names, times, reading identities and Leases,
// and Cilium's answer rule (oldest creationTimestamp, ties to the lowest ID).
import assert from "node:assert/strict";
import {
  answerOf,
  claimName,
  dnsSafe,
  HELD_ANNOTATION,
  heldRemovalPatch,
  identityObject,
  idOfName,
  isQualifiedName,
  keyOfSecurityLabels,
  keyProblem,
  microTime,
  nodeLeaseName,
  nodeLeaseObject,
  nodeRefsObject,
  packHeld,
  parseTime,
  readClaim,
  readIdentity,
  readNodeLease,
  readNodeRefs,
  rfc3339Nano,
  sanitizedLabels,
  securityLabelsOf,
  unpackHeld,
} from "../../../src/backends/k8s/layout.ts";
import { MAX_KEY_BYTES } from "../../../src/backends/k8s/limits.ts";

Deno.test("a canonical label set is stored as Cilium's map and read back to the same key", () => {
  // Sorted by label key (not source), as Cilium's SortedList does.
  const key = "k8s:app=web;reserved:host=;k8s:io.kubernetes.pod.namespace=prod;";
  const map = securityLabelsOf(key);
  assert.deepEqual(map, {
    "k8s:app": "web",
    "k8s:io.kubernetes.pod.namespace": "prod",
    "reserved:host": "",
  });
  assert.equal(keyOfSecurityLabels(map), key);
  // Key order in the stored map does not matter (the API server returns it sorted anyway).
  const reversed = Object.fromEntries(Object.entries(map).reverse());
  assert.equal(keyOfSecurityLabels(reversed), key);
});

Deno.test("any other key is the single label idalloc:key, and reads back exactly", () => {
  for (const key of ["x", "app=web;", "k8s:b=1;k8s:a=2;", "a;b", "k8s:app=web", "ü/ß", " "]) {
    assert.deepEqual(securityLabelsOf(key), { "idalloc:key": key }, key);
    assert.equal(keyOfSecurityLabels(securityLabelsOf(key)), key, key);
  }
});

Deno.test("maps idalloc never writes do not decode", () => {
  for (
    const map of [
      {},
      { app: "web" }, // no source: Cilium's Map2Labels reads it as unspec:app, not the same map
      { "idalloc:key": "" },
      { "idalloc:key": "k8s:a=b;" }, // a label set is stored as its own map
      { "idalloc:key": "x", "k8s:a": "b" }, // the reserved label beside others
      { "k8s:a": 1 },
      { "k8s:a": "b;c" }, // a value with ';' is no label
      null,
      "k8s:a=b;",
      ["k8s:a=b;"],
    ]
  ) {
    assert.equal(keyOfSecurityLabels(map), undefined, JSON.stringify(map));
  }
});

Deno.test("checkKey's rule: empty, NUL, lone surrogates, too large, the reserved label", () => {
  assert.equal(keyProblem("k8s:app=web;"), undefined);
  assert.match(keyProblem("")!, /empty/);
  assert.match(keyProblem("a\0b")!, /NUL/);
  assert.match(keyProblem("a\ud800")!, /well-formed/);
  assert.match(keyProblem("x".repeat(MAX_KEY_BYTES + 1))!, /256 KiB/);
  assert.equal(keyProblem("x".repeat(MAX_KEY_BYTES)), undefined);
  assert.match(keyProblem("idalloc:key=x;")!, /reserved/);
  assert.match(keyProblem("k8s:a=b;idalloc:key=x;")!, /reserved/);
  // Not a canonical label set (unsorted): stored under idalloc:key, so no ambiguity.
  assert.equal(keyProblem("idalloc:key=x;k8s:a=b;"), undefined);
});

Deno.test("metadata.labels: Cilium's SanitizeK8sLabels, then only what Kubernetes accepts", () => {
  assert.deepEqual(
    sanitizedLabels({
      "k8s:app": "web",
      "k8s:app.kubernetes.io/name": "shop",
      "k8s:io.cilium.k8s.namespace.labels.team": "a", // synthesized from namespace labels
      "reserved:host": "",
      "unspec:x": "1",
      "k8s:bad key": "v", // not a label name
      "k8s:long": "v".repeat(64), // value over 63 characters
      "k8s:Upper.Case/x": "v", // the prefix must be a lowercase DNS subdomain
      "k8s:empty": "",
    }),
    { app: "web", "app.kubernetes.io/name": "shop", empty: "" },
  );
  assert.equal(isQualifiedName("example.com/a_b.c-d"), true);
  assert.equal(isQualifiedName("-a"), false);
  assert.equal(isQualifiedName("a/b/c"), false);
});

Deno.test("names: decimal IDs, node Leases (DNS-safe), claims (hashed with the resource)", () => {
  assert.equal(idOfName("1234"), 1234);
  for (const bad of ["0", "007", "-1", "1e3", "", "9007199254740993", 5]) {
    assert.equal(idOfName(bad), undefined, String(bad));
  }
  assert.equal(nodeLeaseName("node-1"), "idalloc-node-node-1");
  assert.match(nodeLeaseName("10.0.0.1"), /^idalloc-node-10-0-0-1-[0-9a-f]{8}$/);
  assert.notEqual(dnsSafe("A"), dnsSafe("a"), "case differences stay apart");
  const claim = claimName("ciliumidentities.cilium.io", "k8s:a=b;");
  assert.match(claim, /^idalloc-key-[0-9a-f]{40}$/);
  assert.notEqual(claim, claimName("ciliumidentities.example.org", "k8s:a=b;"));
});

Deno.test("times: MicroTime has six digits; Cilium's RFC3339Nano marks parse", () => {
  assert.equal(microTime(Date.UTC(2026, 0, 2, 3, 4, 5, 67)), "2026-01-02T03:04:05.067000Z");
  assert.equal(rfc3339Nano(Date.UTC(2026, 0, 2, 3, 4, 5, 670)), "2026-01-02T03:04:05.67Z");
  assert.equal(rfc3339Nano(Date.UTC(2026, 0, 2, 3, 4, 5)), "2026-01-02T03:04:05Z");
  assert.equal(parseTime("2026-01-02T03:04:05.123456789Z"), Date.UTC(2026, 0, 2, 3, 4, 5, 123));
  assert.equal(parseTime("2026-01-02T05:04:05+02:00"), Date.UTC(2026, 0, 2, 3, 4, 5));
  assert.equal(parseTime("yesterday"), undefined);
  assert.equal(parseTime(""), undefined);
});

Deno.test("an identity object round-trips through readIdentity; damage is named", () => {
  const obj = identityObject(
    { apiVersion: "cilium.io/v2", kind: "CiliumIdentity" },
    300,
    "k8s:a=b;",
    {
      "ref.idalloc.io/n1": "e1",
    },
  );
  assert.deepEqual(obj.metadata.labels, { a: "b" });
  obj.metadata.resourceVersion = "17";
  obj.metadata.creationTimestamp = "2026-01-02T03:04:05Z";
  obj.metadata.annotations!["io.cilium.heartbeat"] = "2026-01-02T03:05:00Z";
  obj.metadata.annotations!["ref.idalloc.io/"] = "e0";
  obj.metadata.annotations!["ref.idalloc.io/n2"] = "";
  const read = readIdentity(obj);
  assert.ok(read.ok);
  assert.equal(read.record.id, 300);
  assert.equal(read.record.key, "k8s:a=b;");
  assert.equal(read.record.created, Date.UTC(2026, 0, 2, 3, 4, 5));
  assert.deepEqual([...read.record.refs], [["n1", "e1"]]);
  assert.equal(read.record.mark, "2026-01-02T03:05:00Z");
  assert.equal(read.badRefs.length, 2);

  const bad = readIdentity({ metadata: { name: "web" }, "security-labels": { "k8s:a": "b" } });
  assert.ok(!bad.ok && bad.damage.kind === "master-bad-id");
  const undecodable = readIdentity({ metadata: { name: "5" }, "security-labels": { a: "b" } });
  assert.ok(!undecodable.ok && undecodable.damage.kind === "master-undecodable");
  assert.equal(!undecodable.ok && undecodable.damage.id, 5);
});

Deno.test("identities without annotation references share one empty map (the index's budget)", () => {
  const kind = { apiVersion: "cilium.io/v2", kind: "CiliumIdentity" };
  const [a, b] = [300, 301].map((id) =>
    readIdentity(JSON.parse(JSON.stringify(identityObject(kind, id, `k8s:a=${id};`, {}))))
  );
  assert.ok(a.ok && b.ok);
  assert.equal(a.record.refs.size, 0);
  assert.equal(a.record.refs, b.record.refs, "one map, not one each");
});

Deno.test("Cilium's answer: the oldest creationTimestamp, ties to the lowest ID", () => {
  assert.equal(answerOf([]), undefined);
  assert.equal(answerOf([{ id: 9, created: 2000 }, { id: 7, created: 3000 }])?.id, 9);
  assert.equal(answerOf([{ id: 9, created: 2000 }, { id: 7, created: 2000 }])?.id, 7);
});

Deno.test("node Leases and claims read back what was written", () => {
  const now = Date.UTC(2026, 0, 1, 0, 0, 0, 500);
  const lease = nodeLeaseObject("n1", "e1", 15, now, now - 1000);
  lease.metadata.resourceVersion = "9";
  assert.deepEqual(readNodeLease(lease), {
    name: "idalloc-node-n1",
    node: "n1",
    epoch: "e1",
    expiresAt: now + 15_000,
    rv: "9",
  });
  assert.equal(readNodeLease({ metadata: { name: "x" }, spec: {} }), undefined);
  assert.deepEqual(
    readClaim({
      metadata: {
        name: "idalloc-key-ab",
        resourceVersion: "3",
        labels: { "idalloc.io/id": "42" },
        annotations: { "idalloc.io/key": "x" },
      },
    }),
    { name: "idalloc-key-ab", key: "x", id: 42, rv: "3" },
  );
  assert.equal(readClaim({ metadata: { labels: { "idalloc.io/id": "x" } } }), undefined);
});

Deno.test("reference objects: one packed annotation, in ID order; the earlier per-ID annotations still read", () => {
  const obj = nodeRefsObject("a", new Map([[301, "e2"], [300, "e1"]]));
  assert.deepEqual(obj.metadata.annotations, { [HELD_ANNOTATION]: "300=e1,301=e2" });
  const read = readNodeRefs(obj)!;
  assert.deepEqual([...read.refs], [[300, "e1"], [301, "e2"]]);
  assert.deepEqual([read.legacy, read.bad], [[], []]);
  // An object an earlier version wrote (per-ID), and one caught between the two: both counted,
  // the packed list's epoch standing where both name an ID; bad entries of either reported.
  const mixed = readNodeRefs({
    ...obj,
    metadata: {
      ...obj.metadata,
      annotations: {
        "held.idalloc.io/299": "e0",
        "held.idalloc.io/300": "old",
        "held.idalloc.io/x": "e0",
        [HELD_ANNOTATION]: "300=e1,nope,302=",
      },
    },
  })!;
  assert.deepEqual([...mixed.refs].sort(), [[299, "e0"], [300, "e1"]]);
  assert.deepEqual(mixed.legacy.toSorted(), [
    "held.idalloc.io/299",
    "held.idalloc.io/300",
    "held.idalloc.io/x",
  ]);
  assert.deepEqual(mixed.bad.map((b) => b.entry ?? b.annotation).sort(), [
    "302=",
    "held.idalloc.io/x",
    "nope",
  ]);
  // Removal rewrites the list without the entries and drops the earlier layout's annotation.
  assert.deepEqual(heldRemovalPatch(mixed, { ids: new Set([299, 300]) }), {
    "held.idalloc.io/299": null,
    "held.idalloc.io/300": null,
    [HELD_ANNOTATION]: "nope,302=",
  });
  assert.deepEqual(heldRemovalPatch(mixed, { entries: new Set(["nope", "302="]) }), {
    [HELD_ANNOTATION]: "300=e1",
  });
  assert.deepEqual(heldRemovalPatch(read, { ids: new Set([300, 301]) }), {
    [HELD_ANNOTATION]: null,
  });
  assert.equal(heldRemovalPatch(read, { ids: new Set([7]) }), undefined);
  assert.deepEqual(unpackHeld(packHeld([[5, "a"], [3, "b"]])).refs, new Map([[3, "b"], [5, "a"]]));
});
