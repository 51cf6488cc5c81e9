/**
 * The Kubernetes backend's layout: Cilium's `CiliumIdentity` objects, idalloc's references on
 * them, the node `Lease`s and the key claims, and the rules that turn one into the other.
 *
 * ```text
 * CiliumIdentity <ID>  (cluster-scoped; the resource is an option)
 *   metadata.name                    decimal ID (the create by name is the allocation)
 *   security-labels                  the key: its label map (`source:key` → value), or
 *                                    {"idalloc:key": <key>} for a key that is not a label set
 *   metadata.labels                  the k8s: labels valid as Kubernetes labels (Cilium's
 *                                    SanitizeK8sLabels, filtered to what the API accepts)
 *   metadata.annotations
 *     io.cilium.heartbeat            Cilium's GC mark (RFC 3339 time): unused since then
 *     idalloc.io/lease-namespace     the coordination namespace of its references' Leases
 *     idalloc.io/creator             <node>/<epoch> of the idalloc node that created it
 *     ref.idalloc.io/<node>          <epoch>: a reference in the layout before issue 37 (read, and
 *                                    counted, during the migration; never written any more)
 * Lease idalloc-node-<node>          in the coordination namespace: the node's liveness
 *   spec.holderIdentity = node, renewTime, leaseDurationSeconds; annotation idalloc.io/epoch
 * Lease idalloc-refs-<node>          in the coordination namespace: the node's references, written
 *   by that node only (`refs.ts`); spec.holderIdentity = node;
 *   annotation idalloc.io/held = <id>=<epoch>,… in ID order: a reference to identity <id>, live
 *   while the node's Lease is live and carries that epoch (one annotation: see `refs.ts` for why)
 *   annotations held.idalloc.io/<id> = <epoch>: the same, one annotation per reference, as
 *   written before (read, and removed by the node's next write)
 * Lease idalloc-key-<hash>           in the coordination namespace: the key claim
 *   annotation idalloc.io/key = key, label idalloc.io/id = the ID idalloc nodes create for it;
 *   spec.renewTime = its last write (writer's clock), annotation idalloc.io/touch = a nonce that
 *   a re-creation from the claim changes (`claim.ts`)
 * ```
 *
 * @example A label set is stored as its map; any other key under the reserved label
 * ```ts
 * import assert from "node:assert/strict";
 * import { keyOfSecurityLabels, sanitizedLabels, securityLabelsOf } from "./layout.ts";
 *
 * const map = securityLabelsOf("k8s:app=web;unspec:x=1;");
 * assert.deepEqual(map, { "k8s:app": "web", "unspec:x": "1" });
 * assert.deepEqual(sanitizedLabels(map), { app: "web" });
 * assert.equal(keyOfSecurityLabels(map), "k8s:app=web;unspec:x=1;");
 * assert.deepEqual(securityLabelsOf("app=web;"), { "idalloc:key": "app=web;" });
 * assert.equal(keyOfSecurityLabels({ "idalloc:key": "app=web;" }), "app=web;");
 * ```
 *
 * @module
 */
import { createHash } from "node:crypto";
import { Labels, labelsCodec } from "../../identity/labels.ts";
import { SERVER_TIME_RESOLUTION_MS, serverRenewTimeOf } from "./clock.ts";
import { LEASE_NAMESPACE_ANNOTATION, recordedNamespace } from "./coordination.ts";
import { MAX_KEY_BYTES, utf8Length } from "./limits.ts";
import { type KubeObject, rvOf } from "./kube.ts";

/** Cilium's GC mark (`identitybackend.HeartBeatAnnotation`). */
export const HEARTBEAT_ANNOTATION = "io.cilium.heartbeat";
/**
 * The prefix of a node's reference annotation on an identity, `ref.idalloc.io/<node>`: the layout
 * before the per-node reference objects, still read (and counted) during the migration.
 */
export const REF_PREFIX = "ref.idalloc.io/";
/**
 * The prefix of a reference in a node's reference object as written before the packed
 * {@linkcode HELD_ANNOTATION}: `held.idalloc.io/<id>` → epoch (read, never written).
 */
export const HELD_PREFIX = "held.idalloc.io/";
/** The annotation of a node's reference object that lists its references: `<id>=<epoch>,…`. */
export const HELD_ANNOTATION = "idalloc.io/held";
/** The idalloc node that created an identity: `<node>/<epoch>` (`acquire.ts` recognises it). */
export const CREATOR_ANNOTATION = "idalloc.io/creator";
/** The epoch of a node Lease. */
export const EPOCH_ANNOTATION = "idalloc.io/epoch";
/** The key a claim Lease is for. */
export const KEY_ANNOTATION = "idalloc.io/key";
/** A nonce a node writes into a claim to change its resource version (`claim.ts`). */
export const TOUCH_ANNOTATION = "idalloc.io/touch";
/** The ID a claim Lease names. */
export const ID_LABEL = "idalloc.io/id";
/** What an idalloc Lease is: `node` or `claim`. */
export const ROLE_LABEL = "idalloc.io/role";
/** Kubernetes' recommended label naming the managing tool. */
export const MANAGED_BY_LABEL = "app.kubernetes.io/managed-by";
/** The label under which a key that is not a label set is stored (its value is the key). */
export const RESERVED_KEY_LABEL = "idalloc:key";
/** The name prefix of node Leases. */
export const NODE_LEASE_PREFIX = "idalloc-node-";
/** The name prefix of claim Leases. */
export const CLAIM_PREFIX = "idalloc-key-";
/** The name prefix of the nodes' reference objects (Leases). */
export const REFS_PREFIX = "idalloc-refs-";

/** Label selector of the node Leases. */
export const NODE_SELECTOR = `${MANAGED_BY_LABEL}=idalloc,${ROLE_LABEL}=node`;
/** Label selector of the claim Leases. */
export const CLAIM_SELECTOR = `${MANAGED_BY_LABEL}=idalloc,${ROLE_LABEL}=claim`;
/** Label selector of the nodes' reference objects. */
export const REFS_SELECTOR = `${MANAGED_BY_LABEL}=idalloc,${ROLE_LABEL}=refs`;

/** Cilium's `k8sNamespaceLabelPrefix`: synthesized labels of namespace labels (user input). */
const K8S_NAMESPACE_LABELS = "k8s:io.cilium.k8s.namespace.labels.";

/** A Kubernetes "name" part (label name, annotation name): Kubernetes' `qualifiedNameFmt`. */
const NAME_PART = /^[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
/** A DNS-1123 subdomain (label and annotation prefixes, object names). */
const SUBDOMAIN = /^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$/;
/** A DNS-1123 label (namespaces, resource names). */
export const DNS_LABEL = /^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$/;

/** Whether `name` is a valid label or annotation name part (at most 63 characters). */
export function isNamePart(name: string): boolean {
  return name.length <= 63 && NAME_PART.test(name);
}

/** Whether `name` is a DNS-1123 subdomain (at most 253 characters). */
export function isSubdomain(name: string): boolean {
  return name.length <= 253 && SUBDOMAIN.test(name);
}

/** Kubernetes' `IsQualifiedName`: `[prefix/]name`, the form of label and annotation keys. */
export function isQualifiedName(key: string): boolean {
  const slash = key.indexOf("/");
  if (slash === -1) return isNamePart(key);
  return isSubdomain(key.slice(0, slash)) && isNamePart(key.slice(slash + 1));
}

/** Kubernetes' `IsValidLabelValue`: empty, or a name part. */
export function isLabelValue(value: string): boolean {
  return value === "" || isNamePart(value);
}

// ---------------------------------------------------------------------------------------------
// Keys ↔ security labels

/** The canonical label set `key` encodes, or `undefined` when it is not one. */
function labelSetOf(key: string): Labels | undefined {
  try {
    const labels = labelsCodec.decode(key);
    return labels.size > 0 ? labels : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Why `key` cannot be stored, or `undefined` if it can: empty, not well-formed Unicode, with NUL,
 * too large for an object's annotations (the claim carries the key), or a label set that contains
 * the reserved `idalloc:key` label (it would read back as another key).
 */
export function keyProblem(key: string, sized = true): string | undefined {
  if (typeof key !== "string") return "key must be a string";
  if (key === "") return "key must not be empty";
  if (key.includes("\0")) return "key must not contain NUL";
  if (!key.isWellFormed()) return "key must be well-formed Unicode";
  const size = utf8Length(key);
  if (sized && size > MAX_KEY_BYTES) {
    return `key is ${size} bytes; Kubernetes annotations (256 KiB per object) limit keys to ` +
      `${MAX_KEY_BYTES} bytes`;
  }
  const labels = labelSetOf(key);
  if (labels !== undefined && Object.hasOwn(labels.toMap(), RESERVED_KEY_LABEL)) {
    return `key '${key}' is a label set with the reserved label '${RESERVED_KEY_LABEL}'`;
  }
  return undefined;
}

/**
 * The `security-labels` map of a (checked) key: a canonical label set (Cilium's kvstore string,
 * `source:key=value;` sorted) as its map (Cilium's `GetAsMap`), any other key as the single label
 * `idalloc:key` → the key.
 */
export function securityLabelsOf(key: string): Record<string, string> {
  return labelSetOf(key)?.toMap() ?? { [RESERVED_KEY_LABEL]: key };
}

/**
 * The key a `security-labels` map stores, or `undefined` when it is none idalloc writes: not a
 * map of strings, a map whose labels do not survive Cilium's `Map2Labels` unchanged (a key
 * without a source), `{idalloc:key: S}` where S is empty or itself a label set, a label set
 * with the reserved label beside others, or (with `sized`, the default) a key larger than
 * `MAX_KEY_BYTES`.
 */
export function keyOfSecurityLabels(map: unknown, sized = true): string | undefined {
  if (typeof map !== "object" || map === null || Array.isArray(map)) return undefined;
  const entries = Object.entries(map);
  if (entries.length === 0 || entries.some(([, v]) => typeof v !== "string")) return undefined;
  if (entries.length === 1 && entries[0][0] === RESERVED_KEY_LABEL) {
    const key = entries[0][1] as string;
    return key !== "" && labelSetOf(key) === undefined && keyProblem(key, sized) === undefined
      ? key
      : undefined;
  }
  let labels: Labels;
  try {
    labels = Labels.fromMap(map as Record<string, string>);
  } catch {
    return undefined;
  }
  const back = labels.toMap();
  if (Object.keys(back).length !== entries.length) return undefined;
  if (entries.some(([k, v]) => back[k] !== v)) return undefined;
  const key = labels.toKvstoreString();
  return keyProblem(key, sized) === undefined ? key : undefined;
}

/**
 * Cilium's `SanitizeK8sLabels` (only `k8s:` labels, minus the synthesized namespace labels, with
 * `k8s:` stripped), further filtered to what the API server accepts as labels: Cilium's agents
 * only meet pod labels, which are valid by construction; an idalloc key may hold anything.
 */
export function sanitizedLabels(map: Readonly<Record<string, string>>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(map)) {
    if (!k.startsWith("k8s:") || k.startsWith(K8S_NAMESPACE_LABELS)) continue;
    const name = k.slice(4);
    if (isQualifiedName(name) && isLabelValue(v)) out[name] = v;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Names

/** The ID an identity's name gives (a positive decimal safe integer, no leading zeros). */
export function idOfName(name: unknown): number | undefined {
  if (typeof name !== "string" || !/^[1-9][0-9]*$/.test(name)) return undefined;
  const id = Number(name);
  return Number.isSafeInteger(id) ? id : undefined;
}

/** Whether `node` can name a reference annotation (`ref.idalloc.io/<node>`). */
export function isNodeName(node: string): boolean {
  return isNamePart(node);
}

/** The annotation of `node`'s reference. */
export function refAnnotation(node: string): string {
  return REF_PREFIX + node;
}

/** The node of a reference annotation, `undefined` for another annotation or a bad node part. */
export function nodeOfRefAnnotation(name: string): string | undefined {
  if (!name.startsWith(REF_PREFIX)) return undefined;
  const node = name.slice(REF_PREFIX.length);
  return isNodeName(node) ? node : undefined;
}

function sha256Hex(text: string): string {
  return createHash("sha256").update(text, "utf8").digest("hex");
}

/**
 * `node` as a DNS-1123 label part: lowercased, anything but `[a-z0-9-]` turned into `-`, and, when
 * that changed it, a short hash of the original appended (so `A` and `a` stay apart).
 */
export function dnsSafe(node: string): string {
  const safe = node.toLowerCase().replace(/[^a-z0-9-]/g, "-");
  return safe === node ? safe : `${safe}-${sha256Hex(node).slice(0, 8)}`;
}

/** The name of `node`'s Lease. */
export function nodeLeaseName(node: string): string {
  return NODE_LEASE_PREFIX + dnsSafe(node);
}

/** The name of `node`'s reference object. */
export function refsName(node: string): string {
  return REFS_PREFIX + dnsSafe(node);
}

/** The annotation of a reference to `id` in a node's reference object of the earlier layout. */
export function heldAnnotation(id: number): string {
  return HELD_PREFIX + String(id);
}

/** References (ID → epoch) as the value of {@linkcode HELD_ANNOTATION}: `<id>=<epoch>,…`. */
export function packHeld(refs: Iterable<readonly [number, string]>): string {
  return [...refs].sort((a, b) => a[0] - b[0]).map(([id, epoch]) => `${id}=${epoch}`).join(",");
}

/** The entries of a {@linkcode HELD_ANNOTATION} value: its references and those that are none. */
export function unpackHeld(value: unknown): {
  refs: Map<number, string>;
  bad: { entry: string; reason: string }[];
} {
  const refs = new Map<number, string>();
  const bad: { entry: string; reason: string }[] = [];
  if (typeof value !== "string" || value === "") return { refs, bad };
  for (const entry of value.split(",")) {
    const at = entry.indexOf("=");
    const id = at < 0 ? undefined : idOfName(entry.slice(0, at));
    if (id === undefined) bad.push({ entry, reason: "not <id>=<epoch>" });
    else if (at === entry.length - 1) bad.push({ entry, reason: "the epoch is empty" });
    else refs.set(id, entry.slice(at + 1));
  }
  return { refs, bad };
}

/**
 * The name of the claim of `key` for the identity resource `resource` (`<plural>.<group>`): the
 * resource is hashed in, so that two resources sharing a namespace never read each other's claims.
 */
export function claimName(resource: string, key: string): string {
  return CLAIM_PREFIX + sha256Hex(`${resource}\n${key}`).slice(0, 40);
}

/** RFC 6901 escaping of one JSON-pointer segment. */
export function pointer(...segments: string[]): string {
  return segments.map((s) => "/" + s.replaceAll("~", "~0").replaceAll("/", "~1")).join("");
}

// ---------------------------------------------------------------------------------------------
// Times

/** Kubernetes' `MicroTime` text (exactly six fractional digits) of `ms`. */
export function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/Z$/, "000Z");
}

/** ms since the epoch of an RFC 3339 time (any precision), or `undefined`. */
export function parseTime(text: unknown): number | undefined {
  if (typeof text !== "string" || !/^\d{4}-\d\d-\d\dT/.test(text)) return undefined;
  const ms = Date.parse(text);
  return Number.isFinite(ms) ? ms : undefined;
}

/** Go's `time.RFC3339Nano` text of `ms` (trailing zeros dropped), as Cilium's operator writes it. */
export function rfc3339Nano(ms: number): string {
  return new Date(ms).toISOString().replace(/\.?0*Z$/, "Z");
}

// ---------------------------------------------------------------------------------------------
// Identities

/** One identity as the backend reads it. */
export interface IdentityRecord {
  /** The ID (its name). */
  readonly id: number;
  /** The key its `security-labels` store. */
  readonly key: string;
  /** Its resource version. */
  readonly rv: string;
  /** `creationTimestamp` in ms (second resolution). */
  readonly created: number;
  /**
   * idalloc references written as annotations on the identity (the layout before the per-node
   * reference objects): node → epoch. New references live in the nodes' reference objects.
   */
  readonly refs: ReadonlyMap<string, string>;
  /** Cilium's GC mark, if set (its raw value). */
  readonly mark?: string;
  /** Whether the object has any annotation (JSON patches must create the map otherwise). */
  readonly annotated: boolean;
  /** The coordination namespace it records (`coordination.ts`), if any. */
  readonly leaseNamespace?: string;
}

/** Why an object cannot be read as an identity. */
export interface IdentityDamage {
  /** The damage kind (`master-bad-id`, `master-undecodable`, `master-oversized`). */
  readonly kind: "master-bad-id" | "master-undecodable" | "master-oversized";
  /** The object's name. */
  readonly name: string;
  /** The ID, when the name is one. */
  readonly id?: number;
  /** Why, in words. */
  readonly reason: string;
  /** Its resource version. */
  readonly rv: string;
  /**
   * Whether idalloc made it or references it: it carries `ref.idalloc.io/…` annotations, a
   * creator or a recorded coordination namespace.
   */
  readonly referenced: boolean;
  /** Whether the object has any annotation (see {@linkcode IdentityRecord.annotated}). */
  readonly annotated: boolean;
}

/** One reference annotation that is not a reference (bad node part or empty epoch). */
export interface BadReference {
  /** The annotation's name. */
  readonly annotation: string;
  /** The entry of a packed list ({@linkcode HELD_ANNOTATION}) that is no reference. */
  readonly entry?: string;
  /** Why. */
  readonly reason: string;
}

/** An identity object read: the record, or the damage. */
export type IdentityRead =
  | { readonly ok: true; readonly record: IdentityRecord; readonly badRefs: BadReference[] }
  | { readonly ok: false; readonly damage: IdentityDamage };

/** The `refs` of every identity without annotation references (all of the current layout). */
const NO_REFS: Map<string, string> = new Map();

/** One copy per distinct value (see {@linkcode shared}). */
const sharedStrings = new Map<string, string>();

/**
 * One string per distinct value of a field that repeats across identities (the coordination
 * namespace): `JSON.parse` makes a copy per object, about 32 B each. Bounded: a store with many
 * distinct values starts the table over rather than grow it.
 */
function shared(value: string): string {
  const one = sharedStrings.get(value);
  if (one !== undefined) return one;
  if (sharedStrings.size >= 64) sharedStrings.clear();
  sharedStrings.set(value, value);
  return value;
}

/** Reads an identity object (see {@linkcode IdentityRead}). */
export function readIdentity(obj: KubeObject): IdentityRead {
  const meta = obj.metadata ?? {};
  const name = String(meta.name ?? "");
  const rv = rvOf(obj);
  const annotations = meta.annotations ?? {};
  const marks = {
    referenced: Object.keys(annotations).some((a) =>
      a.startsWith(REF_PREFIX) || a === CREATOR_ANNOTATION || a === LEASE_NAMESPACE_ANNOTATION
    ),
    annotated: Object.keys(annotations).length > 0,
  };
  const id = idOfName(name);
  if (id === undefined) {
    const reason = "the name is not a positive decimal ID";
    return { ok: false, damage: { kind: "master-bad-id", name, reason, rv, ...marks } };
  }
  const key = keyOfSecurityLabels(obj["security-labels"]);
  if (key === undefined) {
    if (keyOfSecurityLabels(obj["security-labels"], false) !== undefined) {
      const reason = `its key is larger than ${MAX_KEY_BYTES} bytes, the layout's limit`;
      return { ok: false, damage: { kind: "master-oversized", name, id, reason, rv, ...marks } };
    }
    const reason = "its security-labels are not a key idalloc can read";
    return { ok: false, damage: { kind: "master-undecodable", name, id, reason, rv, ...marks } };
  }
  let refs = new Map<string, string>();
  const badRefs: BadReference[] = [];
  for (const [annotation, value] of Object.entries(annotations)) {
    if (!annotation.startsWith(REF_PREFIX)) continue;
    const node = nodeOfRefAnnotation(annotation);
    if (node === undefined) badRefs.push({ annotation, reason: "not ref.idalloc.io/<node>" });
    else if (typeof value !== "string" || value === "") {
      badRefs.push({ annotation, reason: "the epoch is empty" });
    } else refs.set(node, value);
  }
  // The informer keeps a record per identity: no empty map each (about 90 B at 100,000).
  if (refs.size === 0) refs = NO_REFS;
  const mark = annotations[HEARTBEAT_ANNOTATION];
  const recorded = recordedNamespace(obj);
  const leaseNamespace = recorded === undefined ? undefined : shared(recorded);
  const record: IdentityRecord = {
    id,
    key,
    rv,
    created: parseTime(meta.creationTimestamp) ?? 0,
    refs,
    ...(typeof mark === "string" ? { mark } : {}),
    annotated: marks.annotated,
    ...(leaseNamespace === undefined ? {} : { leaseNamespace }),
  };
  return { ok: true, record, badRefs };
}

/**
 * Cilium's answer for a key among its identities: the oldest `creationTimestamp` (Cilium's `get`
 * sorts by it), ties (one second resolution) broken by the lowest ID. Cilium's own sort is not
 * stable on ties, so its nodes may disagree on exact ties; idalloc's never do.
 */
export function answerOf<T extends Pick<IdentityRecord, "id" | "created">>(
  identities: Iterable<T>,
): T | undefined {
  let best: T | undefined;
  for (const r of identities) {
    if (
      best === undefined || r.created < best.created ||
      (r.created === best.created && r.id < best.id)
    ) {
      best = r;
    }
  }
  return best;
}

/** The identity object of `key` under `id`, with `annotations` (e.g. the creator's reference). */
export function identityObject(
  kind: { apiVersion: string; kind: string },
  id: number,
  key: string,
  annotations: Record<string, string>,
): KubeObject {
  const map = securityLabelsOf(key);
  return {
    apiVersion: kind.apiVersion,
    kind: kind.kind,
    metadata: {
      name: String(id),
      labels: sanitizedLabels(map),
      ...(Object.keys(annotations).length > 0 ? { annotations } : {}),
    },
    "security-labels": map,
  };
}

// ---------------------------------------------------------------------------------------------
// Leases

/** A node Lease as read. */
export interface NodeLeaseRecord {
  /** The Lease's name. */
  readonly name: string;
  /** `spec.holderIdentity`: the node. */
  readonly node: string;
  /** The epoch annotation (`undefined` when missing or empty). */
  readonly epoch?: string;
  /**
   * When it lapses, in ms on the server's clock: `renewTime + leaseDurationSeconds`, or, when
   * later, the server's own time of the last renewal (whole seconds, so plus one) plus the
   * duration — a holder whose clock is slow writes an early `renewTime` (`clock.ts`).
   * `undefined` when the duration or both times are missing.
   */
  readonly expiresAt?: number;
  /** Its resource version. */
  readonly rv: string;
}

/** Reads a node Lease; `undefined` for an object that names no holder. */
export function readNodeLease(obj: KubeObject): NodeLeaseRecord | undefined {
  const spec = (obj.spec ?? {}) as Record<string, unknown>;
  const node = spec.holderIdentity;
  if (typeof node !== "string" || node === "") return undefined;
  const renew = parseTime(spec.renewTime);
  const seconds = spec.leaseDurationSeconds;
  const epoch = obj.metadata.annotations?.[EPOCH_ANNOTATION];
  const server = serverRenewTimeOf(obj);
  const renewed = server === undefined
    ? renew
    : Math.max(renew ?? -Infinity, server + SERVER_TIME_RESOLUTION_MS);
  return {
    name: String(obj.metadata.name ?? ""),
    node,
    ...(typeof epoch === "string" && epoch !== "" ? { epoch } : {}),
    ...(renewed !== undefined && typeof seconds === "number" && seconds > 0
      ? { expiresAt: renewed + seconds * 1000 }
      : {}),
    rv: rvOf(obj),
  };
}

/** The node Lease object of `node` with `epoch`, renewed at `now`. */
export function nodeLeaseObject(
  node: string,
  epoch: string,
  durationSeconds: number,
  now: number,
  acquired: number,
): KubeObject {
  return {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      name: nodeLeaseName(node),
      labels: { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "node" },
      annotations: { [EPOCH_ANNOTATION]: epoch },
    },
    spec: {
      holderIdentity: node,
      leaseDurationSeconds: durationSeconds,
      acquireTime: microTime(acquired),
      renewTime: microTime(now),
    },
  };
}

/** A claim Lease as read. */
export interface ClaimRecord {
  /** The Lease's name. */
  readonly name: string;
  /** The key it claims an ID for. */
  readonly key: string;
  /** The ID it names. */
  readonly id: number;
  /** Its resource version. */
  readonly rv: string;
  /**
   * When it was last written (`spec.renewTime`, the writer's clock, ms); absent on a claim no
   * idalloc node wrote (hand-made, or written before claims carried it).
   */
  readonly writtenAt?: number;
}

/** Reads a claim Lease; `undefined` when it names no key or no ID. */
export function readClaim(obj: KubeObject): ClaimRecord | undefined {
  const key = obj.metadata.annotations?.[KEY_ANNOTATION];
  const id = idOfName(obj.metadata.labels?.[ID_LABEL]);
  if (typeof key !== "string" || key === "" || id === undefined) return undefined;
  const writtenAt = parseTime((obj.spec as { renewTime?: unknown } | undefined)?.renewTime);
  return {
    name: String(obj.metadata.name ?? ""),
    key,
    id,
    rv: rvOf(obj),
    ...(writtenAt === undefined ? {} : { writtenAt }),
  };
}

/**
 * The claim Lease `name` of `key` naming `id`, written by `node` (its holder, for people) at
 * `now` (`spec.renewTime`: GC and the doctor leave a recently written claim alone, `claim.ts`).
 */
export function claimObject(
  name: string,
  key: string,
  id: number,
  node: string,
  now: number,
): KubeObject {
  return {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      name,
      labels: { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "claim", [ID_LABEL]: String(id) },
      annotations: { [KEY_ANNOTATION]: key },
    },
    spec: { holderIdentity: node, renewTime: microTime(now) },
  };
}

// ---------------------------------------------------------------------------------------------
// Reference objects

/** A node's reference object as read. */
export interface NodeRefsRecord {
  /** The object's name. */
  readonly name: string;
  /** `spec.holderIdentity`: the node. */
  readonly node: string;
  /** Its references: ID → the epoch it was written under. */
  readonly refs: ReadonlyMap<number, string>;
  /**
   * Entries that are no reference (bad ID, empty epoch): annotations under `held.idalloc.io/`,
   * or entries of {@linkcode HELD_ANNOTATION} (`entry` set).
   */
  readonly bad: readonly BadReference[];
  /** The annotations of the earlier layout it carries (`held.idalloc.io/…`), which a write drops. */
  readonly legacy: readonly string[];
  /** Its {@linkcode HELD_ANNOTATION} as read (`""` when absent). */
  readonly packed: string;
  /** Its resource version. */
  readonly rv: string;
}

/** Reads a node's reference object; `undefined` for one that names no holder. */
export function readNodeRefs(obj: KubeObject): NodeRefsRecord | undefined {
  const node = (obj.spec as { holderIdentity?: unknown } | undefined)?.holderIdentity;
  if (typeof node !== "string" || node === "") return undefined;
  const refs = new Map<number, string>();
  const bad: BadReference[] = [];
  const legacy: string[] = [];
  const annotations = obj.metadata.annotations ?? {};
  for (const [annotation, epoch] of Object.entries(annotations)) {
    if (!annotation.startsWith(HELD_PREFIX)) continue;
    legacy.push(annotation);
    const id = idOfName(annotation.slice(HELD_PREFIX.length));
    if (id === undefined) bad.push({ annotation, reason: "not held.idalloc.io/<id>" });
    else if (typeof epoch !== "string" || epoch === "") {
      bad.push({ annotation, reason: "the epoch is empty" });
    } else refs.set(id, epoch);
  }
  // The packed list is the newer writer's: its epoch stands where both name an ID.
  const value = annotations[HELD_ANNOTATION];
  const packed = typeof value === "string" ? value : "";
  const list = unpackHeld(packed);
  for (const [id, epoch] of list.refs) refs.set(id, epoch);
  for (const { entry, reason } of list.bad) {
    bad.push({ annotation: HELD_ANNOTATION, entry, reason });
  }
  const name = String(obj.metadata.name ?? "");
  return { name, node, refs, bad, legacy, packed, rv: rvOf(obj) };
}

/** `node`'s reference object holding `refs` (ID → epoch). */
export function nodeRefsObject(node: string, refs: ReadonlyMap<number, string>): KubeObject {
  const annotations = { [HELD_ANNOTATION]: packHeld(refs) };
  return {
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      name: refsName(node),
      labels: { [MANAGED_BY_LABEL]: "idalloc", [ROLE_LABEL]: "refs" },
      ...(refs.size > 0 ? { annotations } : {}),
    },
    spec: { holderIdentity: node },
  };
}

/**
 * The annotation patch that removes from reference object `record` the references to `ids` and the
 * entries `entries` of {@linkcode HELD_ANNOTATION} (in either layout: the packed list is rewritten
 * without them), or `undefined` when it holds none of them. Apply it guarded by the object's
 * version: the list is rewritten whole.
 */
export function heldRemovalPatch(
  record: Pick<NodeRefsRecord, "legacy" | "packed">,
  remove: { readonly ids?: ReadonlySet<number>; readonly entries?: ReadonlySet<string> },
): Record<string, string | null> | undefined {
  const patch: Record<string, string | null> = {};
  for (const annotation of record.legacy) {
    const id = idOfName(annotation.slice(HELD_PREFIX.length));
    if (id !== undefined && remove.ids?.has(id)) patch[annotation] = null;
  }
  if (record.packed !== "") {
    const all = record.packed.split(",");
    const kept = all.filter((entry) => {
      if (remove.entries?.has(entry)) return false;
      const id = idOfName(entry.slice(0, Math.max(0, entry.indexOf("="))));
      return id === undefined || !remove.ids?.has(id);
    });
    if (kept.length < all.length) patch[HELD_ANNOTATION] = kept.length > 0 ? kept.join(",") : null;
  }
  return Object.keys(patch).length > 0 ? patch : undefined;
}
