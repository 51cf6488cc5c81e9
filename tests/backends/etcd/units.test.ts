/**
 * Pure parts of the etcd backend (no etcd needed): Go path semantics, Cilium's exact matching,
 * option validation, the rate limiter on a virtual clock, batching under etcd's request limit.
 */
import assert from "node:assert/strict";
import { InvalidOptionsError } from "../../../src/errors.ts";
import {
  BATCH_BYTES,
  KEY_COPIES_PER_TXN,
  MAX_KEY_BYTES,
} from "../../../src/backends/etcd/limits.ts";
import { batches } from "../../../src/backends/shared/batching.ts";
import { resolveEtcdOptions } from "../../../src/backends/etcd/options.ts";
import {
  EtcdLayout,
  goClean,
  goJoin,
  parseId,
  prefixEnd,
  prefixMatchesKey,
} from "../../../src/backends/etcd/layout.ts";
import { type LimiterClock, RequestLimiter } from "../../../src/backends/etcd/request_limiter.ts";
import { leaseTtlSeconds } from "../../../src/backends/etcd/session.ts";

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

Deno.test("options: defaults, and every invalid field named in InvalidOptionsError", () => {
  const ok = resolveEtcdOptions({ endpoints: ["http://127.0.0.1:2379"], node: "10.0.0.1" });
  assert.equal(ok.prefix, "cilium/state/identities/v1");
  assert.equal(ok.requestTimeoutMs, 5000);
  assert.equal(ok.qps, undefined);
  const bad: Array<[Record<string, unknown>, string]> = [
    [{ endpoints: [], node: "n" }, "endpoints"],
    [{ endpoints: ["127.0.0.1"], node: "n" }, "endpoints"],
    [{ endpoints: ["127.0.0.1:99999"], node: "n" }, "endpoints"],
    [{ endpoints: ["127.0.0.1:2379/x"], node: "n" }, "endpoints"],
    [{ endpoints: ["etcd 1:2379"], node: "n" }, "endpoints"],
    [{ endpoints: ["http://127.0.0.1:2379/x"], node: "n" }, "endpoints"],
    [{ endpoints: ["http://a:1", "https://b:1"], node: "n" }, "endpoints"],
    [{ endpoints: ["http://a:1"], node: "a/b" }, "node"],
    [{ endpoints: ["http://a:1"], node: ".." }, "node"],
    [{ endpoints: ["http://a:1"], node: "" }, "node"],
    [{ endpoints: ["http://a:1"], node: "n", qps: 0 }, "qps"],
    [{ endpoints: ["http://a:1"], node: "n", user: "u" }, "password"],
    [{ endpoints: ["http://a:1"], node: "n", tls: { ca: "x", cert: "y" } }, "tls"],
    [{ endpoints: ["http://a:1"], node: "n", requestTimeoutMs: -1 }, "requestTimeoutMs"],
    [{ endpoints: ["http://a:1"], node: "n", bogus: 1 }, "options"],
  ];
  for (const [options, field] of bad) {
    assert.throws(
      () => resolveEtcdOptions(options as never),
      (err: unknown) =>
        err instanceof InvalidOptionsError && err.name === "InvalidOptionsError" &&
        err.message.includes(field) && err.cause !== undefined,
      JSON.stringify(options),
    );
  }
});

Deno.test("options: etcdctl's host:port endpoints are http, or https with TLS material", () => {
  const plain = resolveEtcdOptions({
    endpoints: ["127.0.0.1:2379", "[::1]:2380", "etcd-0.example:2379"],
    node: "n",
  });
  assert.deepEqual(plain.endpoints, [
    "http://127.0.0.1:2379",
    "http://[::1]:2380",
    "http://etcd-0.example:2379",
  ]);
  const secure = resolveEtcdOptions({ endpoints: ["10.0.0.1:2379"], node: "n", tls: { ca: "x" } });
  assert.deepEqual(secure.endpoints, ["https://10.0.0.1:2379"]);
  // A URL keeps its own scheme; mixing it with the TLS default is the usual error.
  assert.throws(
    () => resolveEtcdOptions({ endpoints: ["http://a:1", "b:1"], node: "n", tls: { ca: "x" } }),
    /all http:\/\/ or all https:\/\//,
  );
});

Deno.test("lease TTL: ms rounded up to whole seconds, at least 2 s", () => {
  assert.equal(leaseTtlSeconds(500), 2);
  assert.equal(leaseTtlSeconds(2000), 2);
  assert.equal(leaseTtlSeconds(2001), 3);
  assert.equal(leaseTtlSeconds(900_000), 900);
});

/** A clock whose sleeps advance virtual time instead of waiting. */
function virtualClock(): LimiterClock & { t: number } {
  const clock = {
    t: 0,
    now: () => clock.t,
    sleep: (ms: number) => {
      clock.t += ms;
      return Promise.resolve();
    },
  };
  return clock;
}

Deno.test("rate limiter: 10 requests at qps 4 need more than 1 s (virtual clock)", async () => {
  const clock = virtualClock();
  const limiter = new RequestLimiter(4, clock);
  for (let i = 0; i < 10; i++) await limiter.take();
  // Burst 4 goes at once; the other 6 come at 250 ms intervals.
  assert.ok(clock.t > 1000, `virtual time ${clock.t}`);
  assert.equal(limiter.stats().taken, 10);
  assert.equal(limiter.stats().delayed, 6);
});

Deno.test("rate limiter: at qps 100 the same 10 requests do not wait", async () => {
  const clock = virtualClock();
  const limiter = new RequestLimiter(100, clock);
  for (let i = 0; i < 10; i++) await limiter.take();
  assert.equal(clock.t, 0);
  assert.equal(limiter.stats().delayed, 0);
});

Deno.test("rate limiter: concurrent takers queue behind each other; tokens refill over time", async () => {
  const waits: number[] = [];
  const clock: LimiterClock = {
    now: () => 0,
    sleep: (ms) => {
      waits.push(ms);
      return Promise.resolve();
    },
  };
  const limiter = new RequestLimiter(2, clock);
  await Promise.all(Array.from({ length: 5 }, () => limiter.take()));
  assert.deepEqual(waits, [500, 1000, 1500]);
});

Deno.test("rate limiter: an aborted wait rejects with the reason and returns its token", async () => {
  const waits: number[] = [];
  const clock: LimiterClock = {
    now: () => 0,
    sleep: (ms, signal) => {
      waits.push(ms);
      return new Promise((_resolve, reject) => {
        if (signal?.aborted) return reject(signal.reason);
        signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
        if (!signal) reject(new Error("test clock: this wait is never released"));
      });
    },
  };
  const limiter = new RequestLimiter(1, clock);
  await limiter.take();
  const pre = new AbortController();
  pre.abort(new DOMException("stop", "AbortError"));
  await assert.rejects(limiter.take(pre.signal), { name: "AbortError" });
  const ac = new AbortController();
  const reason = new Error("mine");
  const p = limiter.take(ac.signal);
  ac.abort(reason);
  await assert.rejects(p, (e) => e === reason);
  // The abandoned token went back: the next taker waits one interval, not two.
  const ac2 = new AbortController();
  const p2 = limiter.take(ac2.signal);
  ac2.abort(reason);
  await assert.rejects(p2, (e) => e === reason);
  assert.deepEqual(waits, [1000, 1000]);
});

Deno.test("batches stay under the request budget and the count", () => {
  const limits = [50, BATCH_BYTES];
  const small = batches(Array.from({ length: 120 }, (_, i) => i), limits, () => [1, 10]);
  assert.deepEqual(small.map((b) => b.length), [50, 50, 20]);
  const heavy = batches([1, 2, 3, 4], limits, () => [1, BATCH_BYTES / 2 + 1]);
  assert.deepEqual(heavy.map((b) => b.length), [1, 1, 1, 1]);
  assert.ok(MAX_KEY_BYTES * KEY_COPIES_PER_TXN < 1_572_864);
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
