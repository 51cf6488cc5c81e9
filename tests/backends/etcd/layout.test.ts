/**
 * Cilium's etcd key layout, without etcd: Go's path semantics (Cilium's and Go's own test tables),
 * the paths of masters, references and Cilium's mutexes, and Cilium's exact prefix matching.
 */
import assert from "node:assert/strict";
import {
  EtcdLayout,
  goClean,
  goJoin,
  parseId,
  prefixEnd,
  prefixMatchesKey,
} from "../../../src/backends/etcd/layout.ts";

Deno.test("goClean matches Go's path.Clean test table", () => {
  // From Go's src/path/path_test.go (cleantests).
  const table: Array<[string, string]> = [
    ["", "."],
    ["abc", "abc"],
    ["abc/def", "abc/def"],
    ["a/b/c", "a/b/c"],
    [".", "."],
    ["..", ".."],
    ["../..", "../.."],
    ["../../abc", "../../abc"],
    ["/abc", "/abc"],
    ["/", "/"],
    ["abc/", "abc"],
    ["abc/def/", "abc/def"],
    ["a/b/c/", "a/b/c"],
    ["./", "."],
    ["../", ".."],
    ["../../", "../.."],
    ["/abc/", "/abc"],
    ["abc//def//ghi", "abc/def/ghi"],
    ["//abc", "/abc"],
    ["///abc", "/abc"],
    ["//abc//", "/abc"],
    ["abc//", "abc"],
    ["abc/./def", "abc/def"],
    ["/./abc/def", "/abc/def"],
    ["abc/.", "abc"],
    ["abc/def/ghi/../jkl", "abc/def/jkl"],
    ["abc/def/../ghi/../jkl", "abc/jkl"],
    ["abc/def/..", "abc"],
    ["abc/def/../..", "."],
    ["/abc/def/../..", "/"],
    ["abc/def/../../..", ".."],
    ["/abc/def/../../..", "/"],
    ["abc/def/../../../ghi/jkl/../../../mno", "../../mno"],
    ["abc/./../def", "def"],
    ["abc//./../def", "def"],
    ["abc/../../././../def", "../../def"],
  ];
  for (const [input, want] of table) {
    assert.equal(goClean(input), want, `Clean(${JSON.stringify(input)})`);
  }
  // Line terminators are ordinary bytes to Go (and must not slip past the already-clean check).
  assert.equal(goClean("a\n/"), "a\n");
  assert.equal(goClean("\u2028/./b\r/"), "\u2028/b\r");
  assert.equal(goClean("a;\n/b;"), "a;\n/b;");
});

Deno.test("goJoin matches Go's path.Join test table", () => {
  const table: Array<[string[], string]> = [
    [[], ""],
    [[""], ""],
    [["a"], "a"],
    [["a", "b"], "a/b"],
    [["a", ""], "a"],
    [["", "b"], "b"],
    [["/", "a"], "/a"],
    [["/", ""], "/"],
    [["a/", "b"], "a/b"],
    [["a/", ""], "a"],
    [["", ""], ""],
    [["a", "b", "c"], "a/b/c"],
    [["a/b", "../../../xyz"], "../xyz"],
  ];
  for (const [elems, want] of table) {
    assert.equal(goJoin(...elems), want, `Join(${JSON.stringify(elems)})`);
  }
});

Deno.test("Cilium's layout: paths as Go builds them, '//' cleaned like Cilium", () => {
  const l = new EtcdLayout("cilium/state/identities/v1");
  assert.equal(l.idPrefix, "cilium/state/identities/v1/id");
  assert.equal(l.valuePrefix, "cilium/state/identities/v1/value");
  assert.equal(l.masterKey(40905), "cilium/state/identities/v1/id/40905");
  const key = "k8s:app=foo;k8s:io.kubernetes.pod.namespace=default;";
  assert.equal(
    l.refKey(key, "172.0.124.60"),
    `cilium/state/identities/v1/value/${key}/172.0.124.60`,
  );
  // Go's path.Join, which Cilium's kvstore backend uses: a label value `a//b` becomes `a/b`.
  assert.equal(
    l.refKey("unspec:blah=%%//!!;", "n"),
    "cilium/state/identities/v1/value/unspec:blah=%%/!!;/n",
  );
  assert.equal(new EtcdLayout("base/").masterKey(1), "base/id/1");
  assert.equal(l.idOfMasterKey("cilium/state/identities/v1/id/10"), 10);
  assert.equal(l.idOfMasterKey("cilium/state/identities/v1/id/invalid"), undefined);
  assert.equal(l.idOfMasterKey("cilium/state/identities/v1/invalid"), undefined);
  assert.deepEqual(l.splitRefKey(`cilium/state/identities/v1/value/a;/b;/n1`), {
    key: "a;/b;",
    node: "n1",
  });
});

Deno.test("prefixMatchesKey: Cilium's TestPrefixMatchesKey", () => {
  assert.equal(prefixMatchesKey("foo", "foo/bar"), true);
  assert.equal(prefixMatchesKey("foo/;bar;baz;/;a;", "foo/;bar;baz;/;a;/alice"), true);
  assert.equal(prefixMatchesKey("foo/;bar;baz;", "foo/;bar;baz;/;a;/alice"), false);
  assert.equal(prefixMatchesKey("foo/;bar;baz;/;a;/baz", "foo/;bar;baz;/;a;/alice"), false);
});

Deno.test("parseId is ParseUint(10) limited to safe integers", () => {
  assert.equal(parseId("40905"), 40905);
  assert.equal(parseId("0"), 0);
  for (const bad of ["", "-1", "+1", "1e3", " 1", "0x10", "9007199254740993", "1.0"]) {
    assert.equal(parseId(bad), undefined, bad);
  }
});

Deno.test("prefixEnd copies and increments the last byte below 0xff", () => {
  const p = new TextEncoder().encode("ab/");
  assert.deepEqual([...prefixEnd(p)], [...new TextEncoder().encode("ab0")]);
  assert.deepEqual([...p], [...new TextEncoder().encode("ab/")], "input untouched");
  assert.deepEqual([...prefixEnd(new Uint8Array([0x61, 0xff]))], [0x62]);
  assert.deepEqual([...prefixEnd(new Uint8Array([0xff]))], [0]);
});

Deno.test("lock paths are Cilium's: path.Join(lockPrefix, TrimPrefix(key, base))", () => {
  for (const base of ["cilium/state/identities/v1", "a//b/", "/rooted", "x/./y"]) {
    const layout = new EtcdLayout(base);
    for (const id of [1, 65535]) {
      const expected = goJoin(
        goJoin(base, "locks"),
        layout.masterKey(id).startsWith(base)
          ? layout.masterKey(id).slice(base.length)
          : layout.masterKey(id),
      );
      assert.equal(layout.idLockPath(id), expected, `${base} ${id}`);
    }
    assert.equal(layout.keyLockPath("k8s:a=b;"), goJoin(goJoin(base, "locks"), "k8s:a=b;"));
  }
  assert.equal(
    new EtcdLayout("cilium/state/identities/v1").idLockPath(7),
    "cilium/state/identities/v1/locks/id/7",
  );
});
