/** etcd backend options, without etcd: defaults, etcdctl's endpoint forms, and every problem named. */
import assert from "node:assert/strict";
import { InvalidOptionsError } from "../../../src/errors.ts";
import { resolveEtcdOptions } from "../../../src/backends/etcd/options.ts";

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
