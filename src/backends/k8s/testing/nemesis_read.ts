/**
 * What the Kubernetes nemesis reads of a store, as plain functions of the listed objects: the
 * snapshot the store checks take (identities that decode as masters, references — in the nodes'
 * reference objects and, from the older layout, annotations — with their liveness judged as the
 * backend judges it, the rest counted as skipped), the entry counts of
 * the growth run, and its bounds. The store (`./nemesis_store.ts`) lists; these decide.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { k8sSnapshot } from "./nemesis_read.ts";
 *
 * const snapshot = k8sSnapshot({
 *   identities: [
 *     {
 *       metadata: { name: "7", annotations: { "ref.idalloc.io/w1": "e1" } },
 *       "security-labels": { "k8s:app": "web" },
 *     },
 *     { metadata: { name: "ghost" }, "security-labels": { "k8s:app": "web" } },
 *   ],
 *   leases: [{
 *     metadata: {
 *       name: "idalloc-node-w1",
 *       annotations: { "idalloc.io/epoch": "e1" },
 *     },
 *     spec: { holderIdentity: "w1", renewTime: new Date(1_000).toISOString(), leaseDurationSeconds: 3 },
 *   }],
 *   now: 2_000,
 *   skewMs: 500,
 * });
 * assert.deepEqual(snapshot.masters, [{ id: 7, key: "k8s:app=web;" }]);
 * assert.deepEqual(snapshot.refs, [{ key: "k8s:app=web;", node: "w1", id: 7, live: true }]);
 * assert.deepEqual(snapshot.skipped, { "identity not named by an ID": 1 });
 * ```
 *
 * @module
 */
import type {
  GrowthSample,
  SnapshotMaster,
  SnapshotRef,
  StoreSnapshot,
} from "../../../testing/nemesis.ts";
import type { KubeObject } from "../kube.ts";
import {
  nodeLeaseName,
  type NodeLeaseRecord,
  readClaim,
  readIdentity,
  readNodeLease,
  readNodeRefs,
} from "../layout.ts";
import { refLive } from "../liveness.ts";
import { referenceObjects, referencesById, referencesOf, referencingNodes } from "../refs.ts";

/**
 * The objects a snapshot is made of, as listed: identities first, then the reference objects,
 * then the node Leases.
 */
export interface ListedStore {
  /** Every identity object of the resource. */
  readonly identities: readonly KubeObject[];
  /** The nodes' reference objects (`idalloc.io/role=refs`; absent: none). */
  readonly refObjects?: readonly KubeObject[];
  /** The node Leases of the namespace (`idalloc.io/role=node`). */
  readonly leases: readonly KubeObject[];
  /** When the Leases were listed (ms since the epoch). */
  readonly now: number;
  /** The workers' clock-skew margin (`maxClockSkewMs`). */
  readonly skewMs: number;
}

/** Why an identity object does not count as data, by the backend's damage kind. */
const IDENTITY_SKIPS = {
  "master-bad-id": "identity not named by an ID",
  "master-undecodable": "identity whose labels name no key",
  "master-oversized": "identity whose key is too large",
} as const;

/**
 * The node Leases that speak for their holder, by node: a Lease named as its holder's own (a
 * copy under another name, or one without a holder, speaks for nobody). The others are counted
 * under `skip`.
 */
export function nodeLeases(
  objects: readonly KubeObject[],
  skip: (what: string) => void = () => {},
): Map<string, NodeLeaseRecord> {
  const out = new Map<string, NodeLeaseRecord>();
  for (const obj of objects) {
    const lease = readNodeLease(obj);
    if (lease === undefined) skip("node Lease without a holder");
    else if (lease.name !== nodeLeaseName(lease.node)) skip("node Lease not named as its holder's");
    else out.set(lease.node, lease);
  }
  return out;
}

/**
 * The store checks' snapshot: every identity that decodes is a master; every reference annotation
 * on it a reference, live when its node's Lease is live with its epoch (the backend's own rule);
 * the rest counted in `skipped`. One key never has two masters on this backend (idalloc nodes
 * create identities through the key's claim), so `strictMasters` holds.
 */
export function k8sSnapshot(listed: ListedStore): StoreSnapshot {
  const skipped: Record<string, number> = {};
  const skip = (what: string) => (skipped[what] = (skipped[what] ?? 0) + 1);
  const leases = nodeLeases(listed.leases, skip);
  const byId = referencesById(
    referenceObjects((listed.refObjects ?? []).flatMap((o) => readNodeRefs(o) ?? [])).values(),
  );
  const masters: SnapshotMaster[] = [];
  const refs: SnapshotRef[] = [];
  for (const obj of listed.identities) {
    const read = readIdentity(obj);
    if (!read.ok) {
      skip(IDENTITY_SKIPS[read.damage.kind]);
      continue;
    }
    const { id, key } = read.record;
    masters.push({ id, key });
    const nodes = referencingNodes(
      referencesOf(read.record, byId),
      (node, epoch) => refLive(epoch, leases.get(node), listed.now, listed.skewMs),
    );
    for (const [node, live] of nodes) refs.push({ key, node, id, live });
    for (const _ of read.badRefs) skip("reference annotation without a node or an epoch");
  }
  return { at: listed.now, masters, refs, strictMasters: true, skipped };
}

/** Everything the growth run counts: the snapshot's objects and the key claims. */
export interface CountedStore extends ListedStore {
  /** The key claims of the namespace (`idalloc.io/role=claim`). */
  readonly claims: readonly KubeObject[];
}

/**
 * Entries by category, for the growth run: `id` (identities that decode), `damaged` (the rest),
 * `ref` and `ref (dead)`, `marked` (carrying Cilium's GC mark), `claim` (claims that decode),
 * `lease` (node Leases that speak for their node).
 */
export function k8sCounts(store: CountedStore): Record<string, number> {
  const snapshot = k8sSnapshot(store);
  let marked = 0;
  for (const obj of store.identities) {
    const read = readIdentity(obj);
    if (read.ok && read.record.mark !== undefined) marked++;
  }
  return {
    id: snapshot.masters.length,
    damaged: store.identities.length - snapshot.masters.length,
    ref: snapshot.refs.length,
    "ref (dead)": snapshot.refs.filter((r) => !r.live).length,
    marked,
    claim: store.claims.filter((c) => readClaim(c) !== undefined).length,
    lease: nodeLeases(store.leases).size,
  };
}

/**
 * Kubernetes' growth bounds: the key set bounds the claims (one per key at most), the held window
 * bounds references and dead ones, one node keeps one Lease.
 */
export function checkK8sGrowth(
  s: Pick<GrowthSample, "counts">,
  { keys, window }: { readonly keys: number; readonly window: number },
  fail: (what: string) => void,
): void {
  const c = (name: string) => s.counts[name] ?? 0;
  if (c("claim") > keys) fail(`${c("claim")} key claims for ${keys} keys`);
  if (c("ref") > 2 * window) fail(`${c("ref")} references for ${window} held keys`);
  if (c("ref (dead)") > window) fail(`${c("ref (dead)")} dead references`);
  if (c("lease") > 1) fail(`${c("lease")} node Leases for one node`);
}
