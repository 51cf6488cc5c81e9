/**
 * The writes the protocol makes to identity objects, as patch bodies. JSON patches (RFC 6902)
 * where a write must hold only if the object still carries the key: a `test` of
 * `/security-labels` (the API server compares the whole map, in any key order, and refuses the
 * patch with 422 `Invalid` when it differs); merge patches where a `metadata.resourceVersion` in
 * the body guards the write (409 `Conflict` when it changed) or nothing needs guarding.
 *
 * Leases are never replaced with `update` (PUT): for Leases the API server creates a missing object
 * on update, ignoring the resource-version precondition, so a renewal after an operator deleted
 * the Lease would bring back an epoch every observer had already judged dead. A merge patch
 * carrying `metadata.resourceVersion` never creates: 404 when the object is gone, 409 when it
 * changed ({@linkcode guardedMergePatch}).
 *
 * Measured on kube-apiserver v1.20: a JSON `test` of a missing path with value `null` passes; an
 * `add` under `/metadata/annotations` fails while the object has no annotations (the API server
 * omits an empty map), so the map is created by the patch then, guarded by that `null` test; a
 * `remove` of a missing path fails, while `add` then `remove` of it always succeeds; a patch that
 * changes nothing leaves the resource version as it was.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { joinPatch } from "./patch.ts";
 * assert.deepEqual(joinPatch("x", true, "idalloc-system").map((op) => op.op), [
 *   "test",
 *   "add",
 *   "add",
 *   "remove",
 * ]);
 * ```
 *
 * @module
 */
import { LEASE_NAMESPACE_ANNOTATION } from "./coordination.ts";
import {
  HEARTBEAT_ANNOTATION,
  pointer,
  refAnnotation,
  sanitizedLabels,
  securityLabelsOf,
} from "./layout.ts";
import type { KubeObject } from "./kube.ts";

/** One JSON-patch operation. */
export type JsonPatchOp =
  | { readonly op: "test" | "add" | "replace"; readonly path: string; readonly value: unknown }
  | { readonly op: "remove"; readonly path: string };

const ANNOTATIONS = pointer("metadata", "annotations");
const HEARTBEAT = pointer("metadata", "annotations", HEARTBEAT_ANNOTATION);

/** The `test` that the object still carries `key`. */
export function testKey(key: string): JsonPatchOp {
  return { op: "test", path: pointer("security-labels"), value: securityLabelsOf(key) };
}

/**
 * What a joiner writes on an identity that carries `key` when it must (`refs.ts`): Cilium's GC
 * mark removed (Cilium's `AcquireReference`) and, with `namespace`, the coordination namespace
 * recorded (`coordination.ts`), in one write that changes its resource version. The reference
 * itself goes to the joiner's reference object. `annotated`: whether the object has annotations
 * as last read (a wrong guess fails the patch, and the caller reads again).
 */
export function joinPatch(key: string, annotated: boolean, namespace?: string): JsonPatchOp[] {
  const recorded = namespace === undefined ? {} : { [LEASE_NAMESPACE_ANNOTATION]: namespace };
  if (!annotated) {
    return [
      testKey(key),
      { op: "test", path: ANNOTATIONS, value: null },
      // An empty map is dropped by the API server: the mark's removal then needs no op.
      {
        op: "add",
        path: ANNOTATIONS,
        value: { [HEARTBEAT_ANNOTATION]: "", ...recorded },
      },
      { op: "remove", path: HEARTBEAT },
    ];
  }
  return [
    testKey(key),
    ...Object.entries(recorded).map(([name, value]): JsonPatchOp => ({
      op: "add",
      path: pointer("metadata", "annotations", name),
      value,
    })),
    // Whether or not the mark is there: `add` then `remove` always succeeds.
    { op: "add", path: HEARTBEAT, value: "" },
    { op: "remove", path: HEARTBEAT },
  ];
}

/**
 * Identity damage repaired: its `security-labels` (and Kubernetes labels) set to `key`'s, only if
 * it is still at `rv`, with the GC mark removed and the namespace recorded as in
 * {@linkcode joinPatch}, in one write.
 */
export function repairPatch(
  key: string,
  rv: string,
  annotated: boolean,
  namespace?: string,
): JsonPatchOp[] {
  const map = securityLabelsOf(key);
  return [
    { op: "test", path: pointer("metadata", "resourceVersion"), value: rv },
    // `add` of an existing member replaces it.
    { op: "add", path: pointer("security-labels"), value: map },
    { op: "add", path: pointer("metadata", "labels"), value: sanitizedLabels(map) },
    ...joinPatch(key, annotated, namespace).slice(1),
  ];
}

/**
 * `node`'s reference annotation (the older layout) removed from an identity that carries `key`.
 * It fails (422) when the object carries another key or has no annotations at all: in both cases
 * it holds no reference of `node` to `key`.
 */
export function releasePatch(key: string, node: string): JsonPatchOp[] {
  const path = pointer("metadata", "annotations", refAnnotation(node));
  return [testKey(key), { op: "add", path, value: "" }, { op: "remove", path }];
}

/**
 * The references `dead` (node → the dead epoch each carries) removed, each only if it still
 * carries that epoch: a node that wrote its reference again since (a new epoch) fails the patch.
 */
export function sweepPatch(dead: ReadonlyMap<string, string>): JsonPatchOp[] {
  return [...dead].flatMap(([node, epoch]): JsonPatchOp[] => {
    const path = pointer("metadata", "annotations", refAnnotation(node));
    return [{ op: "test", path, value: epoch }, { op: "remove", path }];
  });
}

/** Cilium's GC mark removed, whatever else the object holds (a merge patch). */
export function unmarkPatch(): unknown {
  return { metadata: { annotations: { [HEARTBEAT_ANNOTATION]: null } } };
}

/** Cilium's GC mark set to `time`, only if the object is still at `rv` (a merge patch). */
export function markPatch(rv: string, time: string): unknown {
  return { metadata: { resourceVersion: rv, annotations: { [HEARTBEAT_ANNOTATION]: time } } };
}

/** `node`'s reference removed, only if the object is still at `rv` (a merge patch). */
export function dropReferencePatch(rv: string, node: string): unknown {
  return { metadata: { resourceVersion: rv, annotations: { [refAnnotation(node)]: null } } };
}

/**
 * A merge patch that writes `obj`'s labels, annotations and other fields (not its name, kind or
 * API version) only if the object is still at `rv`: 409 when it changed, 404 when it is gone.
 */
export function guardedMergePatch(obj: KubeObject, rv: string): unknown {
  const { apiVersion: _v, kind: _k, metadata, ...rest } = obj;
  return {
    ...rest,
    metadata: {
      resourceVersion: rv,
      ...(metadata.labels === undefined ? {} : { labels: metadata.labels }),
      ...(metadata.annotations === undefined ? {} : { annotations: metadata.annotations }),
    },
  };
}
