// The acquire protocol's steps on plain data: join Cilium's answer or claim the key; follow a
// claim (join what it names, touch it to re-create a missing one, confirm a foreign key before
// moving it, move one outside the range or naming nothing); after reading an identity, join it,
// touch the claim to re-create it, or move the claim off it.
import assert from "node:assert/strict";
import { afterClaimRead, afterIdentityRead, firstStep } from "../../../src/backends/k8s/acquire.ts";
import { usable } from "../../../src/backends/shared/candidates.ts";
import { readIdentity } from "../../../src/backends/k8s/layout.ts";

const RANGE = { min: 256, max: 65535 };
const claim = (id: number, key = "k") => ({ name: "idalloc-key-x", key, id, rv: "5" });

Deno.test("first step: join Cilium's answer when the index has one, else claim the key", () => {
  assert.deepEqual(firstStep("k", undefined, RANGE), { kind: "claim" });
  assert.deepEqual(firstStep("k", { id: 300, annotated: false }, RANGE), {
    kind: "join",
    id: 300,
    annotated: false,
  });
  assert.throws(() => firstStep("k", { id: 7, annotated: true }, RANGE), {
    name: "InvalidIdError",
  });
  assert.equal(usable(undefined, 7), true);
  assert.equal(usable(RANGE, 0), false);
});

Deno.test("after reading the claim: follow it", () => {
  assert.deepEqual(afterClaimRead("k", undefined, undefined, RANGE), { kind: "claim" });
  // Its identity is missing: touch the claim (under the version read) before re-creating it.
  assert.deepEqual(afterClaimRead("k", claim(300), undefined, RANGE), {
    kind: "touch",
    id: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterClaimRead("k", claim(300), { key: "k", annotated: true }, RANGE), {
    kind: "join",
    id: 300,
    annotated: true,
    claimRv: "5",
  });
  // The index says another key: read it before moving the claim (the index may lag).
  assert.deepEqual(afterClaimRead("k", claim(300), { key: "j", annotated: true }, RANGE), {
    kind: "readIdentity",
    id: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterClaimRead("k", claim(7), undefined, RANGE), {
    kind: "moveClaim",
    from: 7,
    claimRv: "5",
  });
  assert.throws(() => afterClaimRead("k", claim(300, "other"), undefined, RANGE), {
    name: "CorruptEntryError",
  });
  // Naming no key or ID (hand-made): garbage must cost no key, so it is moved like a stale one.
  assert.deepEqual(afterClaimRead("k", { undecodable: true, rv: "5" }, undefined, RANGE), {
    kind: "moveClaim",
    claimRv: "5",
  });
});

Deno.test("after reading the identity: join it, create it, or move the claim off it", () => {
  const of = (key: string) =>
    readIdentity({
      metadata: { name: "300", resourceVersion: "9", annotations: { a: "b" } },
      "security-labels": { "idalloc:key": key },
    });
  assert.deepEqual(afterIdentityRead("k", 300, undefined, "5"), {
    kind: "touch",
    id: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, undefined, undefined), { kind: "claim" });
  assert.deepEqual(afterIdentityRead("k", 300, of("k"), "5"), {
    kind: "join",
    id: 300,
    annotated: true,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, of("k"), undefined), {
    kind: "join",
    id: 300,
    annotated: true,
  });
  assert.deepEqual(afterIdentityRead("k", 300, of("j"), "5"), {
    kind: "moveClaim",
    from: 300,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, of("j"), undefined), { kind: "claim" });
  const damaged = readIdentity({ metadata: { name: "300" }, "security-labels": { x: "y" } });
  assert.deepEqual(afterIdentityRead("k", 300, damaged, "5"), {
    kind: "moveClaim",
    from: 300,
    claimRv: "5",
  });
  // Damaged, but idalloc's (it carries references) and the claim names it: repaired, not replaced.
  const ours = readIdentity({
    metadata: { name: "300", resourceVersion: "8", annotations: { "ref.idalloc.io/a": "e1" } },
    "security-labels": { x: "y" },
  });
  assert.deepEqual(afterIdentityRead("k", 300, ours, "5"), {
    kind: "repair",
    id: 300,
    rv: "8",
    annotated: true,
    claimRv: "5",
  });
  assert.deepEqual(afterIdentityRead("k", 300, ours, undefined), { kind: "claim" });
});
