import assert from "node:assert/strict";
import { InvalidOptionsError } from "../../src/errors.ts";
import {
  allocationRange,
  clusterIdOf,
  clusterIdShift,
  hasLocalScope,
  IdentityScope,
  Labels,
  requiresGlobalIdentity,
  scopeForLabels,
  scopeOf,
} from "../../src/identity/mod.ts";
import { test } from "../_support/test.ts";

test("cluster ranges: 0 → [256, 65535], c → [c<<16, ((c+1)<<16)−1]", () => {
  assert.deepEqual(allocationRange(0), { min: 256, max: 65535 });
  assert.deepEqual(allocationRange(1), { min: 65536, max: 131071 });
  assert.deepEqual(allocationRange(5), { min: 327680, max: 393215 });
  assert.deepEqual(allocationRange(255), { min: 255 << 16, max: 256 * 65536 - 1 });
});

test("511 connected clusters shift by 15", () => {
  assert.equal(clusterIdShift(255), 16);
  assert.equal(clusterIdShift(511), 15);
  assert.deepEqual(allocationRange(0, 511), { min: 256, max: 32767 });
  assert.deepEqual(allocationRange(5, 511), { min: 5 << 15, max: (6 << 15) - 1 });
  assert.deepEqual(allocationRange(511, 511), { min: 511 << 15, max: (512 << 15) - 1 });
  assert.equal(clusterIdOf(5 << 15, 511), 5);
  assert.equal(clusterIdOf(327681), 5);
  assert.equal(clusterIdOf(1000), 0);
});

test("cluster IDs outside [0, max] are refused", () => {
  assert.throws(() => allocationRange(256), InvalidOptionsError);
  assert.throws(() => allocationRange(-1), InvalidOptionsError);
  assert.throws(() => allocationRange(1.5), InvalidOptionsError);
  assert.throws(() => allocationRange(512, 511), InvalidOptionsError);
  // deno-lint-ignore no-explicit-any
  assert.throws(() => allocationRange(1, 1023 as any), InvalidOptionsError);
});

test("scope bits", () => {
  assert.equal(scopeOf(0x01000032), IdentityScope.Local);
  assert.equal(scopeOf(0x02000001), IdentityScope.RemoteNode);
  assert.equal(scopeOf(0xff000001), 0xff000000);
  assert.equal(scopeOf(65535), IdentityScope.Global);
  assert.ok(hasLocalScope(0x01000032));
  assert.ok(!hasLocalScope(0x02000032));
});

test("ScopeForLabels: remote-node, local (cidr/fqdn/reserved only), global", () => {
  const scope = (l: string[]) => scopeForLabels(Labels.parse(l));
  assert.equal(scope(["cidr:1.2.3.4/32"]), IdentityScope.Local);
  assert.equal(
    scope(["fqdn:example.com", "cidr:1.2.3.4/32", "reserved:world"]),
    IdentityScope.Local,
  );
  assert.equal(scope(["reserved:kube-apiserver"]), IdentityScope.Local);
  assert.equal(scope(["reserved:remote-node", "k8s:a=b"]), IdentityScope.RemoteNode);
  assert.equal(scope(["cidr:1.2.3.4/32", "k8s:foo=bar"]), IdentityScope.Global);
  assert.equal(scope(["k8s:foo=bar"]), IdentityScope.Global);
  assert.equal(scope([]), IdentityScope.Global);
  // TestAllocateLocally's needsGlobalIdentity checks.
  assert.equal(requiresGlobalIdentity(Labels.parse(["cidr:1.2.3.4/32"])), false);
  assert.equal(requiresGlobalIdentity(Labels.parse(["k8s:foo=bar"])), true);
});
