import assert from "node:assert/strict";
import {
  allocationRange,
  allValidators,
  clusterIdValidator,
  clusterNameValidator,
} from "../../src/identity/mod.ts";
import { test } from "../_support/test.ts";

test("TestClusterIDValidator: cluster 5 accepts [327680, 393215] only", () => {
  const { min, max } = allocationRange(5);
  assert.equal(min, 327680);
  assert.equal(max, 393215);
  const validate = clusterIdValidator(5);
  for (const id of [min, min + 1, max - 1, max]) {
    assert.equal(validate({ type: "upsert", id, key: "k8s:a=b;" }), undefined, `${id}`);
  }
  for (const id of [1, min - 1, max + 1]) {
    assert.equal(
      validate({ type: "upsert", id, key: "k8s:a=b;" }),
      `ID ${id} does not belong to the allocation range of cluster ID 5`,
    );
    // Deletes are range-checked too.
    assert.notEqual(validate({ type: "delete", id }), undefined);
  }
  assert.equal(
    clusterIdValidator(0)({ type: "upsert", id: 255 }),
    `ID 255 does not belong to the allocation range of cluster ID 0`,
  );
});

test("TestClusterNameValidator: cluster label required with source k8s and the name", () => {
  const validate = clusterNameValidator("foo");
  const upsert = (key?: string) => validate({ type: "upsert", id: 100, key });
  assert.equal(
    upsert("k8s:foo=bar;k8s:bar=baz;unspec:qux=fred;k8s:io.cilium.k8s.policy.cluster=foo;"),
    undefined,
  );
  assert.equal(
    upsert("k8s:foo=bar;k8s:bar=baz;unspec:qux=fred;"),
    "could not find expected label io.cilium.k8s.policy.cluster",
  );
  assert.equal(
    upsert("k8s:foo=bar;k8s:io.cilium.k8s.policy.cluster=bar;"),
    "unexpected cluster name: got bar, expected foo",
  );
  assert.equal(
    upsert("k8s:foo=bar;qux:io.cilium.k8s.policy.cluster=bar;"),
    "unexpected source for cluster label: got qux, expected k8s",
  );
  // Also when a correct k8s label follows.
  assert.equal(
    upsert("qux:io.cilium.k8s.policy.cluster=bar;k8s:io.cilium.k8s.policy.cluster=foo;"),
    "unexpected source for cluster label: got qux, expected k8s",
  );
  assert.equal(upsert(undefined), "unsupported key type <nil>");
  // Deletes always pass, even with an empty key.
  assert.equal(validate({ type: "delete", id: 100, key: "" }), undefined);
  assert.equal(validate({ type: "delete", id: 100 }), undefined);
});

test("allValidators: first rejection wins", () => {
  const both = allValidators(clusterIdValidator(5), clusterNameValidator("foo"));
  assert.match(both({ type: "upsert", id: 1, key: "k8s:a=b;" })!, /allocation range/);
  assert.match(both({ type: "upsert", id: 327680, key: "k8s:a=b;" })!, /could not find/);
  assert.equal(
    both({ type: "upsert", id: 327680, key: "k8s:io.cilium.k8s.policy.cluster=foo;" }),
    undefined,
  );
});
