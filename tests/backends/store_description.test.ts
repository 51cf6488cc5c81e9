/**
 * A store description (what `--store` and a backend's flags name) and the backend's options have
 * one set of bounds per field: every value one refuses, the other refuses in the same words, and
 * what one accepts the other accepts.
 */
import assert from "node:assert/strict";
import { InvalidOptionsError } from "../../src/errors.ts";
import { parseOptions } from "../../src/validate.ts";
import { resolveKvOptions } from "../../src/backends/kv/options.ts";
import { kvStoreDescription } from "../../src/backends/kv/store_description.ts";
import { resolveEtcdOptions } from "../../src/backends/etcd/options.ts";
import { etcdStoreDescription } from "../../src/backends/etcd/store_description.ts";

/** The message `parse` throws for `input`, or `"accepted"`. */
function verdict(parse: () => unknown): string {
  try {
    parse();
    return "accepted";
  } catch (err) {
    assert.ok(err instanceof InvalidOptionsError, String(err));
    return err.message;
  }
}

const WHAT = "backend options";

Deno.test("Deno KV: prefix, poll interval and clock skew have one set of bounds", () => {
  const kv = { atomic() {} };
  const options = { prefix: ["p"], node: "a" };
  const description = { path: "ids.kv", prefix: ["p"], pollIntervalMs: 1000, maxClockSkewMs: 0 };
  const values: Record<string, unknown[]> = {
    prefix: [[], [""], ["a", ""], ["a", Infinity], [true], "p", ["a", 1], ["a", "b"]],
    pollIntervalMs: [0, 9, 1.5, -5, "1s", 10, 20],
    maxClockSkewMs: [-1, 0.5, "5s", 0, 5000],
  };
  let refused = 0;
  for (const [field, tried] of Object.entries(values)) {
    for (const value of tried) {
      const byOptions = verdict(() => resolveKvOptions(kv, { ...options, [field]: value }))
        .replace("Deno KV backend options", WHAT);
      const byDescription = verdict(() =>
        parseOptions(kvStoreDescription, { ...description, [field]: value }, WHAT)
      );
      assert.equal(byDescription, byOptions, `${field}: ${JSON.stringify(value)}`);
      if (byOptions !== "accepted") refused++;
    }
  }
  assert.ok(refused >= 10, "the bad values are refused");
});

Deno.test("etcd: endpoints, prefix, TLS, user, timeouts have one set of bounds", () => {
  const endpoints = ["http://127.0.0.1:2379"];
  const options = { endpoints, node: "a" };
  const description = { endpoints, prefix: "p", dialTimeoutMs: 5000, requestTimeoutMs: 5000 };
  const values: Record<string, unknown[]> = {
    endpoints: [
      [],
      ["ftp://127.0.0.1:2379"],
      ["http://127.0.0.1:2379/v3"],
      ["http://a:1", "https://b:1"],
      ["https://a:1", "https://b:1"],
    ],
    prefix: ["", "a\0b", 5, "cilium/state/identities/v1"],
    tls: [{ ca: "" }, { ca: "x", cert: "c" }, { ca: "x", other: 1 }, {
      ca: "x",
      cert: "c",
      key: "k",
    }],
    user: ["", "root"],
    dialTimeoutMs: [0, 1.5, 600_001, 1, 600_000],
    requestTimeoutMs: [0, -1, 600_001, 30_000],
  };
  let refused = 0;
  for (const [field, tried] of Object.entries(values)) {
    for (const value of tried) {
      // A user needs a password on both sides: given, only the user's own bounds are compared.
      const extra = field === "user" ? { password: "pw" } : {};
      const byOptions = verdict(() =>
        resolveEtcdOptions({ ...options, ...extra, [field]: value } as never)
      ).replace("etcd backend options", WHAT);
      const byDescription = verdict(() =>
        parseOptions(etcdStoreDescription, { ...description, ...extra, [field]: value }, WHAT)
      );
      assert.equal(byDescription, byOptions, `${field}: ${JSON.stringify(value)}`);
      if (byOptions !== "accepted") refused++;
    }
  }
  assert.ok(refused >= 14, "the bad values are refused");
  // The checks across fields are shared too.
  const lone = verdict(() => resolveEtcdOptions({ ...options, user: "root" }))
    .replace("etcd backend options", WHAT);
  assert.equal(
    verdict(() => parseOptions(etcdStoreDescription, { ...description, user: "root" }, WHAT)),
    lone,
  );
});
