// ensure's classification on plain data: ok, a reference to write (missing from the node's
// reference object or of an older epoch there, or a GC mark), an identity to re-create, or a conflict (another key, an older identity of the key, a
// missing identity whose key lives elsewhere) — and the claim rule for re-creating.
import assert from "node:assert/strict";
import { claimAllows, classifyHeld } from "../../../src/backends/k8s/ensure.ts";
import { type IdentityRead, readIdentity } from "../../../src/backends/k8s/layout.ts";

const HELD = { key: "k", id: 300 };
function identity(
  over: { key?: string; mark?: string; created?: string; annotated?: boolean } = {},
): IdentityRead {
  return readIdentity({
    metadata: {
      name: "300",
      resourceVersion: "9",
      creationTimestamp: over.created ?? "2026-01-01T00:00:10Z",
      annotations: {
        ...(over.annotated === false ? {} : { "idalloc.io/lease-namespace": "idalloc-system" }),
        ...(over.mark === undefined ? {} : { "io.cilium.heartbeat": over.mark }),
      },
    },
    "security-labels": { "idalloc:key": over.key ?? "k" },
  });
}
const older = { id: 299, created: Date.parse("2026-01-01T00:00:05Z") };
const newer = { id: 301, created: Date.parse("2026-01-01T00:00:20Z") };

Deno.test("healthy: ok; reference missing (or of an older epoch) or marked: write it", () => {
  assert.deepEqual(classifyHeld(HELD, identity(), [], true), { kind: "ok" });
  assert.deepEqual(classifyHeld(HELD, identity(), [newer], true), { kind: "ok" });
  assert.deepEqual(classifyHeld(HELD, identity(), [], false), {
    kind: "reference",
    annotated: true,
  });
  assert.deepEqual(classifyHeld(HELD, identity({ annotated: false }), [], false), {
    kind: "reference",
    annotated: false,
  });
  assert.deepEqual(classifyHeld(HELD, identity({ mark: "2026-01-01T00:01:00Z" }), [], true), {
    kind: "reference",
    annotated: true,
  });
});

Deno.test("conflicts: another key, an older identity of the key, unreadable, gone elsewhere", () => {
  assert.equal(classifyHeld(HELD, identity({ key: "j" }), [], true).kind, "conflict");
  assert.equal(classifyHeld(HELD, identity(), [older], true).kind, "conflict");
  const damaged = readIdentity({ metadata: { name: "300" }, "security-labels": {} });
  assert.equal(classifyHeld(HELD, damaged, [], true).kind, "conflict");
  assert.equal(classifyHeld(HELD, undefined, [newer], true).kind, "conflict");
  // The index still lists the gone identity itself: not a reason to give it up.
  assert.deepEqual(classifyHeld(HELD, undefined, [{ id: 300, created: 0 }], true), {
    kind: "recreate",
  });
});

Deno.test("damaged labels on an identity carrying idalloc references: repair it", () => {
  const ours = readIdentity({
    metadata: { name: "300", resourceVersion: "9", annotations: { "ref.idalloc.io/n1": "e1" } },
    "security-labels": { "idalloc:key": "k8s:corrupt=1;" },
  });
  assert.deepEqual(classifyHeld(HELD, ours, [], true), {
    kind: "repair",
    rv: "9",
    annotated: true,
  });
});

Deno.test("re-creating follows the claim: absent or naming the ID", () => {
  const claim = (id: number, key = "k") => ({ name: "c", key, id, rv: "1" });
  assert.equal(claimAllows(undefined, "k", 300), true);
  assert.equal(claimAllows(claim(300), "k", 300), true);
  assert.equal(claimAllows(claim(301), "k", 300), false);
  assert.equal(claimAllows(claim(300, "j"), "k", 300), false);
});
