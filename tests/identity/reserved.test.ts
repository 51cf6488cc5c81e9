import assert from "node:assert/strict";
import { InvalidOptionsError } from "../../src/errors.ts";
import {
  Labels,
  ReservedIdentities,
  ReservedIdentity,
  WellKnownIdentity,
} from "../../src/identity/mod.ts";
import { test } from "../_support/test.ts";

const ns = "io.kubernetes.pod.namespace";
const sa = "io.cilium.k8s.policy.serviceaccount";
const cluster = "io.cilium.k8s.policy.cluster";
const metaName = "io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name";

function kvstoreLabels(clusterName: string): string[] {
  return [
    "k8s:app=etcd",
    "k8s:etcd_cluster=cilium-etcd",
    "k8s:io.cilium/app=etcd-operator",
    `k8s:${ns}=kube-system`,
    `k8s:${sa}=default`,
    `k8s:${cluster}=${clusterName}`,
  ];
}

test("reserved IDs 1–10 have Cilium's numbers and labels", () => {
  const r = new ReservedIdentities();
  const names: Array<[string, number]> = [
    ["host", 1],
    ["world", 2],
    ["unmanaged", 3],
    ["health", 4],
    ["init", 5],
    ["remote-node", 6],
    ["ingress", 8],
    ["world-ipv4", 9],
    ["world-ipv6", 10],
  ];
  for (const [name, id] of names) {
    assert.equal(r.lookupByLabels(Labels.parse([`reserved:${name}`]))?.id, id, name);
    assert.equal(r.lookupById(id)?.labels.toKvstoreString(), `reserved:${name}=;`);
    assert.equal(r.idOf(name), id);
  }
  // kube-apiserver: its identity carries remote-node too; a lone label still finds it.
  assert.equal(
    r.lookupById(7)?.labels.toKvstoreString(),
    "reserved:kube-apiserver=;reserved:remote-node=;",
  );
  assert.equal(r.lookupByLabels(Labels.parse(["reserved:kube-apiserver"]))?.id, 7);
  assert.equal(r.lookupById(0), undefined);
  assert.equal(r.lookupById(11), undefined);
  assert.equal(ReservedIdentity.Health, 4);
});

test("TestAllocateIdentityReserved: host, world, health, init, unmanaged", () => {
  const r = new ReservedIdentities();
  const expect: Array<[string, number]> = [
    ["reserved:host", 1],
    ["reserved:world", 2],
    ["reserved:health", 4],
    ["reserved:init", 5],
    ["reserved:unmanaged", 3],
  ];
  for (const [label, id] of expect) {
    assert.equal(r.lookupByLabels(Labels.parse([label]))?.id, id);
  }
});

test("TestLookupReservedIdentityByLabels", () => {
  const r = new ReservedIdentities({ fixedIdentities: { 129: "kvstore" } });
  // Fixed identity "kvstore" is user-defined: 129.
  const fixed = r.lookupByLabels(Labels.parse(["io.cilium.fixed-identity=kvstore"]));
  assert.equal(fixed?.id, 129);
  assert.equal(fixed?.labels.toKvstoreString(), "reserved:kvstore=;");
  // A fixed identity that is not user-defined: nothing, and no fall-through to reserved.
  assert.equal(r.lookupByLabels(Labels.parse(["io.cilium.fixed-identity=kube-dns"])), undefined);
  assert.equal(
    r.lookupByLabels(Labels.parse(["io.cilium.fixed-identity=nope", "reserved:host"])),
    undefined,
  );
  // reserved:host alone, and with other labels (which the identity keeps).
  assert.equal(r.lookupByLabels(Labels.parse(["reserved:host"]))?.id, 1);
  const hostPlus = r.lookupByLabels(Labels.parse(["reserved:host", "id.foo"]));
  assert.equal(hostPlus?.id, 1);
  assert.equal(hostPlus?.labels.size, 2);
  // Well-known kvstore labels → 101.
  assert.equal(r.lookupByLabels(Labels.parse(kvstoreLabels("default")))?.id, 101);
  // A lone user-reserved name is not a reserved identity.
  assert.equal(r.lookupByLabels(Labels.parse(["reserved:kvstore"])), undefined);
});

test("remote-node and kube-apiserver combinations", () => {
  const r = new ReservedIdentities();
  const id = (labels: string[]) => r.lookupByLabels(Labels.parse(labels))?.id;
  assert.equal(id(["reserved:remote-node"]), 6);
  assert.equal(id(["reserved:remote-node", "reserved:kube-apiserver"]), 7);
  assert.equal(id(["reserved:host", "reserved:kube-apiserver"]), 1);
  assert.equal(id(["reserved:remote-node", "k8s:node=a"]), 6);
  assert.equal(r.lookupByLabels(Labels.parse(["reserved:remote-node", "k8s:a=b"]))?.labels.size, 2);
  // Any other reserved label among several: nothing (workloads can't borrow reserved IDs).
  assert.equal(id(["reserved:world", "k8s:app=web"]), undefined);
  assert.equal(id(["reserved:world", "reserved:health"]), undefined);
  // No reserved label at all: nothing.
  assert.equal(id(["k8s:app=web"]), undefined);
  // The value must be empty for the host/remote-node rules.
  assert.equal(id(["reserved:host=x", "k8s:a=b"]), undefined);
  // In remote-node-scope mode, remote-node label sets get no reserved identity.
  const scoped = new ReservedIdentities({ remoteNodeScope: true });
  assert.equal(scoped.lookupByLabels(Labels.parse(["reserved:remote-node"])), undefined);
  assert.equal(scoped.lookupByLabels(Labels.parse(["reserved:host"]))?.id, 1);
});

test("well-known identities 100–115 depend on cluster name and namespace", () => {
  const r = new ReservedIdentities({ clusterName: "c5" });
  const kvstore = Labels.parse(kvstoreLabels("c5"));
  assert.equal(r.lookupByLabels(kvstore)?.id, WellKnownIdentity.CiliumKVStore);
  assert.equal(r.lookupByLabels(Labels.parse(kvstoreLabels("default"))), undefined);
  assert.equal(
    r.lookupByLabels(kvstore.with(...Labels.parse([`k8s:${metaName}=kube-system`])))?.id,
    WellKnownIdentity.CiliumKVStore2,
  );
  const kubeDns = Labels.parse([
    "k8s:k8s-app=kube-dns",
    `k8s:${ns}=kube-system`,
    `k8s:${sa}=kube-dns`,
    `k8s:${cluster}=c5`,
  ]);
  assert.equal(r.lookupByLabels(kubeDns)?.id, 102);
  // A subset or superset is not a match.
  assert.equal(r.lookupByLabels(kubeDns.with(...Labels.parse(["k8s:x=y"]))), undefined);
  const ids = [...r].map((i) => i.id).filter((id) => id >= 100 && id < 128);
  assert.deepEqual(ids, Array.from({ length: 16 }, (_, i) => 100 + i));
  const custom = new ReservedIdentities({ ciliumNamespace: "cilium" });
  assert.ok(custom.lookupById(105)?.labels.get(ns)?.value === "cilium");
  assert.ok(custom.lookupById(102)?.labels.get(ns)?.value === "kube-system");
});

test("fixed identities must be in 128–255 with unique names", () => {
  const bads: Array<Record<number, string>> = [{ 127: "x" }, { 256: "x" }, { 130: "" }, {
    130: "host",
  }, {
    130: "a;b",
  }];
  for (const bad of bads) {
    assert.throws(() => new ReservedIdentities({ fixedIdentities: bad }), InvalidOptionsError);
  }
  assert.throws(
    () => new ReservedIdentities({ fixedIdentities: { 130: "dup", 131: "dup" } }),
    InvalidOptionsError,
  );
  assert.ok(new ReservedIdentities({ fixedIdentities: { 128: "a", 255: "b" } }).isReserved(255));
});
