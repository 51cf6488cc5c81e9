/**
 * The check a run beside Cilium CRD-mode nodes adds (`--cilium N` on Kubernetes): **no identity
 * that an idalloc node holds, or that a `CiliumEndpoint` names, is ever deleted** — by idalloc's GC
 * or by Cilium's operator rule. Two collectors share one store there, and either may delete what
 * the other's users still need.
 *
 * Every deletion comes from the store's record (`deleted`: the identity's last state, with its
 * idalloc references `node → epoch`), and is judged against the record at the deletion's
 * revision (resource versions are etcd revisions, one order for identities, endpoints and Leases):
 *
 * - **held**: a reference on it whose node's Lease had that epoch and had certainly not expired
 *   when the deletion was seen (`expiresAt - skew` after the recorder's instant, which is no
 *   earlier than the deletion itself);
 * - **endpoint-named**: a `CiliumEndpoint` (an endpoint reference in the record) named its ID.
 *
 * Who deleted it: idalloc's GC when a pass of the GC loop (`gc.jsonl`) listed the ID among its
 * deletions around that instant, else Cilium's operator. The class follows: idalloc's GC deleting
 * either kind is idalloc's fault (**idalloc-only**); the operator deleting an identity an idalloc
 * node held is too (**mixed (idalloc's)**: idalloc keeps the operator's mark off what it holds);
 * the operator deleting one only an endpoint named is Cilium's own rule (**Cilium-only**). A
 * deletion inferred across a gap of the record (not seen as its own event) is listed as uncertain
 * and fails nothing: its last state may predate the deletion.
 *
 * @example An operator deletion of an identity an endpoint names is flagged
 * ```ts
 * import assert from "node:assert/strict";
 * import { checkDeletions } from "./deletions.ts";
 * const { violations } = checkDeletions({
 *   changes: [
 *     { t: "ref", rev: 5, at: 1_000, key: "k8s:app=k1;", node: "c0", id: 300, lease: "cep" },
 *     { t: "deleted", rev: 9, at: 2_000, id: 300, key: "k8s:app=k1;", refs: {}, marked: true },
 *   ],
 *   gcPasses: [],
 *   skewMs: 500,
 * });
 * assert.equal(violations.length, 1);
 * assert.equal((violations[0].evidence as { class: string }).class, "Cilium-only");
 * ```
 *
 * @module
 */
import type { StoreChange } from "../../src/testing/store_changes.ts";
import type { AttributionClass } from "./attribution.ts";
import { clock, type Violation } from "./violation.ts";

/** The check's name. */
export const DELETION_CHECK = "no held or endpoint-named identity is deleted";

/** The lease name endpoint references carry in the record. */
const ENDPOINT_LEASE = "cep";

/** How long after a GC pass's end its deletion may be seen by the recorder. */
const RECORDER_LAG_MS = 5_000;

/** One pass of idalloc's GC loop, as `gc.jsonl` logs it. */
export interface GcPass {
  readonly start: number;
  readonly end: number;
  readonly deleted?: readonly number[];
}

/** What {@linkcode checkDeletions} reads. */
export interface DeletionInput {
  /** The store's record (any order). */
  readonly changes: readonly StoreChange[];
  /** idalloc's GC passes. */
  readonly gcPasses: readonly GcPass[];
  /** The clock-skew margin Leases are judged with. */
  readonly skewMs: number;
  /** IDs planted as garbage (their deletion is GC's job). */
  readonly planted?: ReadonlySet<number>;
}

/** One deletion, judged. */
export interface JudgedDeletion {
  readonly id: number;
  readonly key: string;
  readonly rev: number;
  readonly at: number;
  /** idalloc nodes whose live reference it carried. */
  readonly heldBy: readonly string[];
  /** Cilium nodes whose endpoint named it. */
  readonly namedBy: readonly string[];
  readonly deleter: "idalloc GC" | "Cilium operator";
  readonly inferred: boolean;
}

/** What {@linkcode checkDeletions} found. */
export interface DeletionResult {
  /** Every deletion recorded. */
  readonly deletions: number;
  /** By deleter. */
  readonly byDeleter: Readonly<Record<JudgedDeletion["deleter"], number>>;
  /** Certain deletions of a held or endpoint-named identity, classed in `evidence.class`. */
  readonly violations: Violation[];
  /** Deletions inferred across a gap that would have counted: reported, not failed. */
  readonly uncertain: readonly JudgedDeletion[];
}

/** See the module doc. */
export function checkDeletions(input: DeletionInput): DeletionResult {
  const sorted = [...input.changes].filter((c) => c.t !== "gap")
    .sort((a, b) => (a as { rev: number }).rev - (b as { rev: number }).rev) as Exclude<
      StoreChange,
      { t: "gap" }
    >[];
  const leases = new Map<string, { epoch: string | null; expiresAt: number | null }>();
  /** Endpoint references: `key\0node` → ID. */
  const endpoints = new Map<string, { node: string; id: number }>();
  const byDeleter = { "idalloc GC": 0, "Cilium operator": 0 };
  const violations: Violation[] = [];
  const uncertain: JudgedDeletion[] = [];
  let deletions = 0;
  for (const c of sorted) {
    if (c.t === "lease") {
      leases.set(c.node, { epoch: c.epoch, expiresAt: c.expiresAt });
    } else if (c.t === "ref" && (c.lease === ENDPOINT_LEASE || c.id === null)) {
      const name = `${c.key}\u0000${c.node}`;
      if (c.id === null) endpoints.delete(name);
      else endpoints.set(name, { node: c.node, id: c.id });
    } else if (c.t === "deleted") {
      if (input.planted?.has(c.id)) continue;
      deletions++;
      const heldBy = Object.entries(c.refs).filter(([node, epoch]) => {
        const lease = leases.get(node);
        return lease?.epoch === epoch && lease.expiresAt !== null &&
          lease.expiresAt - input.skewMs > c.at;
      }).map(([node]) => node);
      const namedBy = [...endpoints.values()].filter((e) => e.id === c.id).map((e) => e.node);
      const deleter = deleterOf(c.id, c.at, input.gcPasses);
      byDeleter[deleter]++;
      if (heldBy.length === 0 && namedBy.length === 0) continue;
      const judged: JudgedDeletion = {
        id: c.id,
        key: c.key,
        rev: c.rev,
        at: c.at,
        heldBy,
        namedBy,
        deleter,
        inferred: c.inferred ?? false,
      };
      if (judged.inferred) {
        uncertain.push(judged);
        continue;
      }
      const cls: AttributionClass = deleter === "idalloc GC"
        ? "idalloc-only"
        : heldBy.length > 0
        ? "mixed (idalloc's)"
        : "Cilium-only";
      violations.push({
        check: DELETION_CHECK,
        message:
          `${deleter} deleted identity ${c.id} (${c.key}) at ${clock(c.at)} (revision ${c.rev})` +
          (heldBy.length > 0 ? `, held by idalloc node(s) ${heldBy.join(", ")} (live Lease)` : "") +
          (namedBy.length > 0 ? `, named by endpoint(s) of ${namedBy.join(", ")}` : ""),
        evidence: { ...judged, class: cls, marked: c.marked, refs: c.refs },
      });
    }
  }
  return { deletions, byDeleter, violations, uncertain };
}

/** idalloc's GC when one of its passes listed `id` as deleted around `at`, else the operator. */
function deleterOf(id: number, at: number, passes: readonly GcPass[]): JudgedDeletion["deleter"] {
  const ours = passes.some((p) =>
    p.start <= at && at <= p.end + RECORDER_LAG_MS && (p.deleted ?? []).includes(id)
  );
  return ours ? "idalloc GC" : "Cilium operator";
}
