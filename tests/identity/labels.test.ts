import assert from "node:assert/strict";
import {
  compareUtf8,
  Label,
  LabelError,
  Labels,
  labelsCodec,
  splitLabel,
} from "../../src/identity/mod.ts";
import { test } from "../_support/test.ts";

test("splitLabel follows Cilium's ParseLabel rules", () => {
  const cases: Array<[string, string, string, string]> = [
    ["k8s:app=web", "k8s", "app", "web"],
    ["k8s:app", "k8s", "app", ""],
    ["app=web", "unspec", "app", "web"],
    ["app", "unspec", "app", ""],
    ["$host", "reserved", "host", ""],
    ["$=host", "reserved", "host", ""],
    ["reserved:=host", "reserved", "host", ""],
    ["reserved.host", "reserved", "host", ""],
    ["reserved:host", "reserved", "host", ""],
    ["k8s:a=b=c", "k8s", "a", "b=c"],
    ["k8s:a:b=c:d", "k8s", "a:b", "c:d"],
    [":a=b", "unspec", "a", "b"],
    ["foo:bar==value", "foo", "bar", "=value"],
    ["k8s:=value", "k8s", "", "value"],
    ["cidr:10.0.0.0/8", "cidr", "10.0.0.0/8", ""],
    ["cidr:2001:db8::/32", "cidr", "2001:db8::/32", ""],
    ["", "unspec", "", ""],
  ];
  for (const [input, source, key, value] of cases) {
    assert.deepEqual(splitLabel(input), { source, key, value }, input);
  }
});

test("Label prints as Cilium's String and FormatForKVStore", () => {
  const l = Label.parse("k8s:app=web");
  assert.equal(l.toString(), "k8s:app=web");
  assert.equal(l.toKvstoreString(), "k8s:app=web;");
  const empty = Label.parse("cidr:1.2.3.4/32");
  assert.equal(empty.toString(), "cidr:1.2.3.4/32");
  assert.equal(empty.toKvstoreString(), "cidr:1.2.3.4/32=;");
  assert.equal(Label.parse("$host").toString(), "reserved:host");
});

test("Label matching honours the any source", () => {
  const k8s = Label.parse("k8s:app=web");
  assert.ok(Label.parse("any:app=web").matches(k8s));
  assert.ok(!k8s.matches(Label.parse("any:app=web")));
  assert.ok(!Label.parse("container:app=web").matches(k8s));
  assert.ok(Labels.parse(["k8s:app=web"]).has(Label.parse("any:app=web")));
});

test("kvstore string is sorted by key and byte-exact (Cilium example)", () => {
  const labels = Labels.parse([
    "k8s:zgroup=testDS",
    "k8s:io.kubernetes.pod.namespace=default",
    "k8s:io.cilium.k8s.policy.serviceaccount=default",
    "k8s:io.cilium.k8s.policy.cluster=default",
  ]);
  assert.equal(
    labels.toKvstoreString(),
    "k8s:io.cilium.k8s.policy.cluster=default;k8s:io.cilium.k8s.policy.serviceaccount=default;" +
      "k8s:io.kubernetes.pod.namespace=default;k8s:zgroup=testDS;",
  );
  // Sorted by key only, not by source.
  assert.equal(
    Labels.parse(["a:z=1", "z:a=2"]).toKvstoreString(),
    "z:a=2;a:z=1;",
  );
});

test("kvstore and label string forms round-trip, incl. '=', '/', ':' and empty values", () => {
  const sets = [
    ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"],
    ["unspec:blah=%%//!!", "unspec:id=foo", "unspec:user=anna"],
    ["k8s:eq=a=b==c", "k8s:path=/var/run/x", "k8s:url=http://h:80/p?q=1"],
    ["cidr:1.2.3.4/32", "reserved:world"],
    ["k8s:empty=", "k8s:x:y=z"],
    ["container:ünïcødé=✓", "k8s:emoji=😀", "k8s:\uffff=bmp"],
    ["k8s:app.kubernetes.io/name: cilium-etcd-operator"],
  ];
  for (const set of sets) {
    const labels = Labels.parse(set);
    const stored = labels.toKvstoreString();
    const back = Labels.fromKvstoreString(stored);
    assert.ok(back.equals(labels), stored);
    assert.equal(back.toKvstoreString(), stored);
    assert.equal(labelsCodec.decode(labelsCodec.encode(labels)).toKvstoreString(), stored);
    // Each label's String form parses back to the same label.
    for (const l of labels) assert.ok(Label.parse(l.toString()).equals(l), l.toString());
    // The map form (GetAsMap / PutKeyFromMap) round-trips too.
    assert.ok(Labels.fromMap(labels.toMap()).equals(labels));
  }
  assert.equal(Labels.parse(["k8s:empty="]).toKvstoreString(), "k8s:empty=;");
  assert.equal(Labels.parse(["cidr:1.2.3.4/32"]).toKvstoreString(), "cidr:1.2.3.4/32=;");
});

test("what cannot round-trip is a LabelError", () => {
  const bad = [
    () => Labels.parse(["k8s:app=web;evil"]),
    () => new Label("k8s", "a;b", "v"),
    () => new Label("k8s", "a=b", "v"),
    () => new Label("k8s", "", "v"),
    () => new Label("", "k", "v"),
    () => new Label("a:b", "k", "v"),
    () => new Label("a;b", "k", "v"),
    () => new Label("$src", "k", "v"),
    () => Label.parse("k8s:"),
    () => labelsCodec.decode("k8s:b=2;k8s:a=1;"), // not sorted
    () => labelsCodec.decode("k8s:a=1"), // no final ';'
    () => labelsCodec.decode("k8s:a;"), // no '='
    () => labelsCodec.decode("k8s:a=1;k8s:a=2;"), // duplicate key
    () => labelsCodec.decode("$host=;"), // not the canonical source form
  ];
  for (const fn of bad) {
    assert.throws(fn, (err: unknown) => err instanceof LabelError && err.name === "LabelError");
  }
});

test("Labels.parse refuses empty keys and two values of one key", () => {
  const labels = Labels.parse(["k8s:app=a", "k8s:app=a"]);
  assert.equal(labels.size, 1, "the same label twice counts once");
  assert.equal(labels.get("app")?.toString(), "k8s:app=a");
  // Cilium's NewLabelsFromModel skips these silently: a typo would become another identity.
  for (const empty of ["", "k8s:=x", "=x", "k8s:", "reserved:"]) {
    assert.throws(
      () => Labels.parse(["k8s:app=a", empty]),
      (err: unknown) =>
        err instanceof LabelError &&
        err.message.startsWith(`label ${JSON.stringify(empty)} has an empty key`),
      JSON.stringify(empty),
    );
  }
  // Stored strings keep Cilium's reading: the `;` that ends the last label leaves an empty part.
  assert.equal(Labels.fromKvstoreString("").size, 0);
  assert.equal(Labels.fromKvstoreString("k8s:a=b;").size, 1);
  assert.equal(Labels.parse("k8s:single=1").size, 1);
  // Cilium's NewLabelsFromModel keeps the last silently: a typo would become another identity.
  for (const conflicting of [["k8s:a=b", "k8s:a=c"], ["k8s:app=a", "container:app=a"]]) {
    assert.throws(
      () => Labels.parse(conflicting),
      (err: unknown) => err instanceof LabelError && /same key/.test(err.message),
    );
  }
  // Label objects keep Cilium's map semantics: the last one of a key wins.
  const merged = Labels.from([...Labels.parse("k8s:app=a"), ...Labels.parse("container:app=b")]);
  assert.equal(merged.get("app")?.toString(), "container:app=b");
});

test("compareUtf8 matches UTF-8 byte order", () => {
  const words = ["b", "a", "\uffff", "😀", "ab", "", "\ue000", "z"];
  const byBytes = [...words].sort((x, y) => {
    const a = new TextEncoder().encode(x);
    const b = new TextEncoder().encode(y);
    for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return a[i] - b[i];
    return a.length - b.length;
  });
  assert.deepEqual([...words].sort(compareUtf8), byBytes);
  // JavaScript's default order would put the emoji before U+FFFF.
  assert.notDeepEqual([...words].sort(), byBytes);
});

test("Labels helpers: with, toJSON, equals", () => {
  const base = Labels.parse(["k8s:app=web"]);
  const more = base.with(Label.parse("k8s:io.cilium.k8s.policy.cluster=c1"));
  assert.equal(base.size, 1);
  assert.equal(more.size, 2);
  assert.deepEqual(more.toJSON(), ["k8s:app=web", "k8s:io.cilium.k8s.policy.cluster=c1"]);
  assert.equal(more.toString(), "k8s:app=web,k8s:io.cilium.k8s.policy.cluster=c1");
  assert.ok(!more.equals(base));
  assert.ok(Labels.parse(["k8s:app=web"]).equals(base));
});

test("codec decode is lazy yet equal to eager parsing", () => {
  const labels = Labels.parse(["k8s:b=2", "cidr:1.2.3.4/32", "k8s:a=x=y"]);
  const decoded = labelsCodec.decode(labels.toKvstoreString());
  assert.equal(decoded.size, 3);
  assert.ok(decoded.equals(labels));
  assert.equal(decoded.get("a")?.value, "x=y");
  assert.deepEqual(decoded.toJSON(), labels.toJSON());
  assert.deepEqual([...decoded].map(String), [...labels].map(String));
  assert.equal(labelsCodec.decode("").size, 0);
});

test("codec accepts exactly the strings that round-trip (randomized)", () => {
  const alphabet = ["a", "b", ":", "=", ";", "$", "k8s:", "reserved:", "/"];
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  let accepted = 0;
  for (let n = 0; n < 20_000; n++) {
    let str = "";
    const len = Math.floor(random() * 12);
    for (let i = 0; i < len; i++) str += alphabet[Math.floor(random() * alphabet.length)];
    let roundTrips: boolean;
    try {
      roundTrips = Labels.fromKvstoreString(str).toKvstoreString() === str;
    } catch {
      roundTrips = false;
    }
    let decoded: Labels | undefined;
    try {
      decoded = labelsCodec.decode(str);
    } catch (err) {
      assert.ok(err instanceof LabelError);
    }
    assert.equal(decoded !== undefined, roundTrips, JSON.stringify(str));
    if (decoded) {
      accepted++;
      assert.equal(decoded.toKvstoreString(), str);
      assert.equal(decoded.size, Labels.fromKvstoreString(str).size);
    }
  }
  assert.ok(accepted > 100, `only ${accepted} canonical strings generated`);
});
