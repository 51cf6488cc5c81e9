/**
 * Garbage a Kubernetes store can hold, planted as a broken writer would (a script, `kubectl`), next
 * to valid data and never over it:
 *
 * - `non-numeric-id`: an identity named not as an ID, carrying a run key;
 * - `empty-master`: identities under free IDs whose labels name no key (`{}`, a label without
 *   a source);
 * - `bad-ref`: a reference annotation without an epoch, on a run key's identity;
 * - `orphan-ref`: a reference of a node without a Lease, or of a live node under an epoch it does
 *   not hold, on a run key's identity: dead from the start, it must neither keep the identity
 *   from GC nor count as the node's;
 * - `oversized`: an identity of the largest key the layout takes (valid data GC collects), and one
 *   past it (damage);
 * - `bad-claim`: the claim Lease of a run key that has no identity and no claim, naming no key and
 *   no ID;
 * - `stale-claim`: the same, naming an ID that is another key's, free, or outside every range,
 *   written an hour ago (left behind);
 * - `bad-lease`: a node Lease with no epoch and no renewal time;
 * - `forged-lease`: a live node's Lease copied under another name for an hour: it must not keep
 *   the node's references live once the node is gone;
 * - `bad-endpoint`: Cilium endpoints that name no identity.
 *
 * (`invalid-utf8` has no Kubernetes form: the API speaks JSON.)
 *
 * @module
 */
import {
  type GarbageTargets,
  OVERSIZED_KEY_PREFIX,
  type Planted,
} from "../../../testing/nemesis.ts";
import type { KubeClient, KubeObject, KubeResourceDescriptor } from "../client.ts";
import { isStatus } from "../kube.ts";
import {
  claimName,
  claimObject,
  EPOCH_ANNOTATION,
  ID_LABEL,
  type IdentityRecord,
  KEY_ANNOTATION,
  MANAGED_BY_LABEL,
  microTime,
  NODE_LEASE_PREFIX,
  NODE_SELECTOR,
  readIdentity,
  refAnnotation,
  ROLE_LABEL,
  securityLabelsOf,
} from "../layout.ts";
import { MAX_KEY_BYTES } from "../limits.ts";
import { LEASES } from "../options.ts";
import { listAll } from "../paging.ts";
import { nodeLeases } from "./nemesis_read.ts";

/** The garbage kinds of a Kubernetes store. */
export const K8S_GARBAGE = [
  "non-numeric-id",
  "empty-master",
  "bad-ref",
  "orphan-ref",
  "oversized",
  "bad-claim",
  "stale-claim",
  "bad-lease",
  "forged-lease",
  "bad-endpoint",
] as const;

/** One garbage kind. */
export type K8sGarbage = typeof K8S_GARBAGE[number];

/** Where garbage goes. */
export interface GarbageSite {
  /** An admin client. */
  readonly client: KubeClient;
  /** The identity resource, with its kind. */
  readonly identities: KubeResourceDescriptor;
  /** Cilium's endpoint resource. */
  readonly endpoints: KubeResourceDescriptor;
  /** The namespace of the Leases and claims. */
  readonly namespace: string;
}

/** What one planting wrote. */
interface Planting {
  readonly site: GarbageSite;
  readonly targets: GarbageTargets;
  /** A name no valid entry has (`nemesis-ghost-<n>`). */
  readonly tag: string;
  readonly entries: string[];
  readonly masterIds: number[];
}

/** How long ago a planted stale claim was written: long enough to be quiet for GC and the doctor. */
const LEFT_BEHIND_MS = 3_600_000;

/** Attempts at a free name or a fitting target before giving up ("nothing free to plant on"). */
const ATTEMPTS = 20;

/** Plants garbage of `kind` (see the module doc), tagged `tag`. */
export async function plantK8s(
  site: GarbageSite,
  kind: string,
  targets: GarbageTargets,
  tag: string,
): Promise<Planted> {
  const p: Planting = { site, targets, tag, entries: [], masterIds: [] };
  const garbage = kind as K8sGarbage;
  switch (garbage) {
    case "non-numeric-id":
      await createIdentity(p, tag, securityLabelsOf(targets.key()));
      break;
    case "empty-master":
      // (An empty string value is refused by the API server: `{"idalloc:key": ""}` cannot be.)
      await createSomewhere(p, {});
      await createSomewhere(p, { "no-source": "x" });
      break;
    case "bad-ref":
    case "orphan-ref":
      await annotateRunIdentity(p, garbage);
      break;
    case "oversized": {
      // The layout's largest key (the claim carries it as an annotation), and one past it.
      const value = "x".repeat(MAX_KEY_BYTES - 64);
      const id = await createSomewhere(p, securityLabelsOf(`${OVERSIZED_KEY_PREFIX}${value};`));
      if (id !== undefined) p.masterIds.push(id);
      await createSomewhere(p, { "idalloc:key": "k".repeat(MAX_KEY_BYTES + 4_096) });
      break;
    }
    case "bad-claim":
    case "stale-claim":
      await plantClaim(p, garbage);
      break;
    case "bad-lease":
    case "forged-lease":
      await plantLease(p, garbage);
      break;
    case "bad-endpoint":
      await plantEndpoints(p);
      break;
    default:
      throw new Error(`garbage kind ${kind} does not exist on k8s`);
  }
  return { kind, entries: p.entries, masterIds: p.masterIds };
}

/** An entry as the report shows it: its name and a short form of its content. */
function show(what: string, content: unknown): string {
  const text = JSON.stringify(content);
  return `${what} = ${text.length > 120 ? `${text.slice(0, 60)}…(${text.length} chars)` : text}`;
}

/** Creates identity `name` with `labels`; false when the name is taken. */
async function createIdentity(
  p: Planting,
  name: string,
  labels: Record<string, string>,
): Promise<boolean> {
  const { client, identities } = p.site;
  try {
    await client.create(identities, {
      apiVersion: `${identities.group}/${identities.version}`,
      kind: identities.kind,
      metadata: { name },
      "security-labels": labels,
    });
  } catch (err) {
    if (isStatus(err, 409)) return false;
    throw err;
  }
  p.entries.push(show(`${identities.plural}/${name}`, labels));
  return true;
}

/** Creates an identity with `labels` under the first free ID of a few drawn; the ID. */
async function createSomewhere(
  p: Planting,
  labels: Record<string, string>,
): Promise<number | undefined> {
  for (let i = 0; i < ATTEMPTS; i++) {
    const id = p.targets.id();
    if (await createIdentity(p, String(id), labels)) return id;
  }
  return undefined;
}

/** Every identity that decodes. */
async function identityRecords(site: GarbageSite): Promise<IdentityRecord[]> {
  const { items } = await listAll(site.client, site.identities, {
    signal: AbortSignal.timeout(30_000),
  });
  return items.flatMap((obj) => {
    const read = readIdentity(obj);
    return read.ok ? [read.record] : [];
  });
}

/**
 * Adds a reference annotation to an identity of a run key (the drawn key's, else one drawn by ID
 * among all): `bad-ref` without an epoch, `orphan-ref` under an epoch no Lease holds, of a node
 * without a Lease or, half the time, of a live node that holds no reference there. Guarded by the
 * identity's version; nothing it carries is overwritten.
 */
async function annotateRunIdentity(p: Planting, kind: "bad-ref" | "orphan-ref"): Promise<void> {
  const { client, identities, namespace } = p.site;
  const records = await identityRecords(p.site);
  if (records.length === 0) return;
  const key = p.targets.key();
  const coin = p.targets.id();
  const target = records.find((r) => r.key === key) ?? records[coin % records.length];
  let node = p.tag;
  if (kind === "orphan-ref" && coin % 2 === 0) {
    const { items } = await listAll(client, LEASES, {
      namespace,
      labelSelector: NODE_SELECTOR,
      signal: AbortSignal.timeout(30_000),
    });
    const live = [...nodeLeases(items).keys()].filter((n) => !target.refs.has(n));
    if (live.length > 0) node = live[coin % live.length];
  }
  const annotation = refAnnotation(node);
  const value = kind === "bad-ref" ? "" : `${p.tag.replace(/\W/g, "")}dead`;
  try {
    await client.patch(identities, String(target.id), {
      metadata: { resourceVersion: target.rv, annotations: { [annotation]: value } },
    }, { type: "merge" });
  } catch (err) {
    // Changed or gone since listed: its holders' data is not to be overwritten.
    if (isStatus(err, 409) || isStatus(err, 404)) return;
    throw err;
  }
  p.entries.push(show(`${identities.plural}/${target.id} (${target.key}) ${annotation}`, value));
}

/**
 * The claim of a run key that has neither an identity nor a claim: `bad-claim` names no key and
 * no ID, `stale-claim` names a drawn ID (another key's, a free one, or one above every range).
 */
async function plantClaim(p: Planting, kind: "bad-claim" | "stale-claim"): Promise<void> {
  const { client, identities, namespace } = p.site;
  const resource = `${identities.plural}.${identities.group}`;
  const used = new Set((await identityRecords(p.site)).map((r) => r.key));
  for (let i = 0; i < ATTEMPTS; i++) {
    const key = p.targets.key();
    if (used.has(key)) continue;
    const name = claimName(resource, key);
    const obj: KubeObject = kind === "stale-claim"
      ? claimObject(name, key, p.targets.id(), p.tag, Date.now() - LEFT_BEHIND_MS)
      : {
        apiVersion: "coordination.k8s.io/v1",
        kind: "Lease",
        metadata: { name, labels: { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "claim" } },
        spec: { holderIdentity: p.tag },
      };
    try {
      await client.create(LEASES, obj, { namespace });
    } catch (err) {
      if (isStatus(err, 409)) continue;
      throw err;
    }
    const labels = obj.metadata.labels ?? {};
    p.entries.push(show(`leases/${name} (claim of ${key})`, {
      id: labels[ID_LABEL] ?? null,
      key: obj.metadata.annotations?.[KEY_ANNOTATION] ?? null,
    }));
    return;
  }
}

/**
 * `bad-lease`: a node Lease of a node without one, with no epoch and no renewal time.
 * `forged-lease`: a live node's Lease (its epoch included) copied under another name, for an hour.
 */
async function plantLease(p: Planting, kind: "bad-lease" | "forged-lease"): Promise<void> {
  const { client, namespace } = p.site;
  const name = `${NODE_LEASE_PREFIX}${p.tag}`;
  const labels = { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "node" };
  let spec: Record<string, unknown> = { holderIdentity: p.tag, leaseDurationSeconds: 3 };
  let annotations: Record<string, string> = {};
  if (kind === "forged-lease") {
    const { items } = await listAll(client, LEASES, {
      namespace,
      labelSelector: NODE_SELECTOR,
      signal: AbortSignal.timeout(30_000),
    });
    const leases = [...nodeLeases(items).values()].filter((l) => l.epoch !== undefined);
    if (leases.length === 0) return;
    const copied = leases[p.targets.id() % leases.length];
    const now = microTime(Date.now());
    spec = {
      holderIdentity: copied.node,
      leaseDurationSeconds: 3_600,
      acquireTime: now,
      renewTime: now,
    };
    annotations = { [EPOCH_ANNOTATION]: copied.epoch! };
  }
  await client.create(LEASES, {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: { name, labels, annotations },
    spec,
  }, { namespace });
  p.entries.push(show(`leases/${name}`, { annotations, spec }));
}

/** Two Cilium endpoints that name no identity: no status identity, and one without an ID. */
async function plantEndpoints(p: Planting): Promise<void> {
  const { client, endpoints, namespace } = p.site;
  const statuses = [{ state: "ready" }, { state: "ready", identity: { labels: ["k8s:a=b"] } }];
  for (const [i, status] of statuses.entries()) {
    const name = `${p.tag}-${i}`;
    await client.create(endpoints, {
      apiVersion: `${endpoints.group}/${endpoints.version}`,
      kind: "CiliumEndpoint",
      metadata: { name },
      status,
    }, { namespace });
    p.entries.push(show(`${endpoints.plural}/${namespace}/${name}`, { status }));
  }
}
