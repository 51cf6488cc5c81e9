/**
 * The damage report on Kubernetes ({@linkcode StoreDoctor}): one consistent list of the
 * identities, then the Leases of the namespace, reporting what idalloc (and Cilium) cannot use,
 * and a removal guarded by the listed resource version.
 *
 * Reported:
 * - identities named not as a decimal ID (`master-bad-id`), whose `security-labels` do not
 *   decode (`master-undecodable`) or decode to a key over the layout's limit (`master-oversized`);
 *   removing one also removes the key's claim naming it, if that was quiet when listed;
 * - references that name no node, ID or epoch (`reference-bad-key`, `reference-undecodable`):
 *   annotations `ref.idalloc.io/…` on identities (the older layout) and `held.idalloc.io/…` in the
 *   nodes' reference objects (`refs.ts`); and (with valid ranges) references to an identity outside
 *   them (`reference-out-of-range`), in either place;
 * - keys with several identities (`key-duplicate`, one finding per identity that is not Cilium's
 *   answer: the oldest stays; removing a duplicate deletes it);
 * - claims that name no key or ID (`claim-undecodable`) or whose identity is gone or carries
 *   another key (`claim-stale`) — only once quiet (`claim.ts`: a claim written recently may be a
 *   node between its claim write and its identity create), judged at a time before the listing;
 *   a claim naming a damaged identity is not stale (the identity's finding covers it);
 * - node Leases without an epoch or an end (`node-lease-undecodable`).
 *
 * Each finding names what holds it: for an identity (a duplicate, a damaged one), whatever keeps
 * it in use by GC's own rule (`users.ts`): its live nodes, the `CiliumEndpoint`s and
 * `CiliumEndpointSlice`s naming it (`CiliumEndpoint <namespace>/<name>`, `CiliumEndpointSlice
 * <name>`), or a creation or mark less than the store's grace ago (`gcGraceMs`, by default
 * Cilium's heartbeat timeout: an agent may be about to write the endpoint naming it). For a reference, its live node (for an annotation without an epoch,
 * its node while that node's Lease is live). A held finding is refused by {@linkcode removeDamage}
 * with `LiveEntryError`: `doctor --fix` removes only the duplicates nothing uses.
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import {
  type DamageFinding,
  type DamageKind,
  type DamageScanOptions,
  decodeToken,
  encodeToken,
  heldBy,
  type RangeCheck,
  rangeCheck,
  shorten,
} from "../../allocator/damage.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { claimQuiet, claimStaleness } from "./claim.ts";
import type { K8sContext } from "./context.ts";
import { isStatus, type KubeObject } from "./kube.ts";
import {
  answerOf,
  CLAIM_SELECTOR,
  claimName,
  type ClaimRecord,
  HELD_ANNOTATION,
  heldAnnotation,
  heldRemovalPatch,
  type IdentityRecord,
  NODE_SELECTOR,
  nodeLeaseName,
  type NodeLeaseRecord,
  nodeOfRefAnnotation,
  type NodeRefsRecord,
  readClaim,
  readIdentity,
  readNodeLease,
  readNodeRefs,
  REF_PREFIX,
  REFS_SELECTOR,
} from "./layout.ts";
import { referenceObjects, referencesById } from "./refs.ts";
import { leaseLive, refLive } from "./liveness.ts";
import { endpointUsers, readEndpoints, usedBy } from "./users.ts";
import { LEASES, storeGraceMs } from "./options.ts";
import { listAll } from "./paging.ts";

const log = idallocLogger("k8s", "doctor");

/** The token's backend tag. */
const TAG = "k8s";

const tokenSchema = z.object({
  /** What the entry is: an identity, one annotation of it, a claim or a node Lease. */
  what: z.enum(["identity", "annotation", "claim", "lease", "held"]),
  /** The store: the identity resource and the namespace. */
  store: z.string(),
  name: z.string().min(1),
  annotation: z.string().optional(),
  /** An entry of a reference object's packed list (`idalloc.io/held`), removed from it alone. */
  entry: z.string().optional(),
  rv: z.string(),
  kind: z.string(),
  held: z.array(z.string()).optional(),
  /** A damaged identity's quiet claim (name and version as listed), removed with it. */
  claim: z.object({ name: z.string().min(1), rv: z.string() }).strict().optional(),
}).strict();

type Token = z.infer<typeof tokenSchema>;

function storeOf(ctx: Pick<K8sContext, "resourceName" | "namespace">): string {
  return `${ctx.resourceName}@${ctx.namespace}`;
}

/** What a damage scan read: one list of each, identities first (as GC reads them). */
export interface DamageSnapshot {
  /** The time (own clock) before the identities were listed; claims are judged quiet at it. */
  readonly readAt?: number;
  readonly identities: readonly KubeObject[];
  /** The nodes' reference objects (`refs.ts`), listed after the identities (none: absent). */
  readonly refObjects?: readonly KubeObject[];
  readonly nodeLeases: readonly KubeObject[];
  readonly claims: readonly KubeObject[];
  /** The `CiliumEndpoint`s of all namespaces (none when absent). */
  readonly endpoints?: readonly KubeObject[];
  /** The `CiliumEndpointSlice`s (none when absent). */
  readonly endpointSlices?: readonly KubeObject[];
}

/** Reads the snapshot a scan judges. */
async function readSnapshot(ctx: K8sContext, signal: AbortSignal): Promise<DamageSnapshot> {
  const leases = (labelSelector: string) =>
    listAll(ctx.client, LEASES, { namespace: ctx.namespace, labelSelector, signal });
  const readAt = ctx.settings.now();
  const identities = (await listAll(ctx.client, ctx.identities, { signal })).items;
  const refObjects = (await leases(REFS_SELECTOR)).items;
  const nodeLeases = (await leases(NODE_SELECTOR)).items;
  const claims = (await leases(CLAIM_SELECTOR)).items;
  const endpoints = await readEndpoints(ctx, signal);
  return { readAt, identities, refObjects, nodeLeases, claims, ...endpoints };
}

/** Lists the damaged entries of the store (see the module doc). Reads only. */
export async function* findDamage(
  ctx: K8sContext,
  options: DamageScanOptions = {},
): AsyncGenerator<DamageFinding> {
  const signal = options.signal ?? new AbortController().signal;
  yield* judgeDamage(ctx, await readSnapshot(ctx, signal), options);
}

/** The findings of `snapshot` (plain data in, findings out; see the module doc). */
export function judgeDamage(
  ctx: Pick<K8sContext, "resourceName" | "namespace" | "settings">,
  snapshot: DamageSnapshot,
  options: DamageScanOptions = {},
): DamageFinding[] {
  const scan = new Scan(ctx, snapshot, options);
  const records: IdentityRecord[] = [];
  const out: DamageFinding[] = [];
  for (const obj of snapshot.identities) out.push(...scan.identity(obj, records));
  out.push(...scan.duplicates(records));
  out.push(...scan.referenceObjects());
  for (const obj of snapshot.claims) out.push(...scan.claim(obj));
  for (const obj of snapshot.nodeLeases) out.push(...scan.nodeLease(obj));
  return out;
}

/**
 * One scan's judgement: the node Leases' liveness, what each ID holds, the quiet claims, the
 * valid ranges, and how findings look.
 */
class Scan {
  readonly #ctx: Pick<K8sContext, "resourceName" | "namespace" | "settings">;
  readonly #leases = new Map<string, NodeLeaseRecord>();
  /** ID → the key its identity carries, `null` for a damaged one. */
  readonly #holding = new Map<number, string | null>();
  /** Our claims, by the ID they name. */
  readonly #claims = new Map<number, ClaimRecord>();
  readonly #check: RangeCheck | undefined;
  readonly #now: number;
  readonly #readAt: number;
  /** ID → the Cilium objects naming it. */
  readonly #users: ReadonlyMap<number, readonly string[]>;
  /** The nodes' reference objects, by node. */
  readonly #refObjects: ReadonlyMap<string, NodeRefsRecord>;
  /** Their references: ID → node → epoch. */
  readonly #refs: ReadonlyMap<number, ReadonlyMap<string, string>>;

  constructor(
    ctx: Pick<K8sContext, "resourceName" | "namespace" | "settings">,
    snapshot: DamageSnapshot,
    options: DamageScanOptions,
  ) {
    this.#ctx = ctx;
    this.#check = rangeCheck(options);
    this.#now = ctx.settings.now();
    this.#readAt = snapshot.readAt ?? this.#now;
    this.#users = endpointUsers(snapshot.endpoints ?? [], snapshot.endpointSlices ?? []);
    this.#refObjects = referenceObjects(
      (snapshot.refObjects ?? []).flatMap((obj) => readNodeRefs(obj) ?? []),
    );
    this.#refs = referencesById(this.#refObjects.values());
    for (const obj of snapshot.nodeLeases) {
      const l = readNodeLease(obj);
      if (l !== undefined && l.name === nodeLeaseName(l.node)) this.#leases.set(l.node, l);
    }
    for (const obj of snapshot.identities) {
      const read = readIdentity(obj);
      if (read.ok) this.#holding.set(read.record.id, read.record.key);
      else if (read.damage.id !== undefined) this.#holding.set(read.damage.id, null);
    }
    for (const obj of snapshot.claims) {
      const claim = readClaim(obj);
      if (claim !== undefined && claimName(ctx.resourceName, claim.key) === claim.name) {
        this.#claims.set(claim.id, claim);
      }
    }
  }

  #live(node: string, epoch: string): boolean {
    return refLive(epoch, this.#leases.get(node), this.#now, this.#ctx.settings.maxClockSkewMs);
  }

  /** What keeps `record` in use, by GC's rule (`users.ts`). */
  #usedBy(record: IdentityRecord): string[] {
    const { settings } = this.#ctx;
    const use = { refs: this.#refs, leases: this.#leases, users: this.#users, now: this.#now };
    const graceMs = storeGraceMs(settings);
    return usedBy(record, {
      ...use,
      settings: { maxClockSkewMs: settings.maxClockSkewMs, graceMs },
    });
  }

  #quiet(claim: ClaimRecord): boolean {
    return claimQuiet(claim, this.#readAt, this.#ctx.settings);
  }

  /** The live nodes whose references (by annotation, however malformed the rest) name `obj`. */
  #holders(annotations: Readonly<Record<string, string>>): string[] {
    return Object.entries(annotations).flatMap(([annotation, epoch]) => {
      const node = nodeOfRefAnnotation(annotation);
      return node !== undefined && this.#live(node, epoch) ? [node] : [];
    });
  }

  #finding(
    kind: DamageKind,
    token: Omit<Token, "store" | "kind">,
    reason: string,
    about: { id?: number; key?: string; node?: string },
    holders: readonly string[] = [],
  ): DamageFinding {
    const { namespace, resourceName } = this.#ctx;
    const entry = token.what === "claim" || token.what === "lease" || token.what === "held"
      ? `${namespace}/${token.name}${token.annotation === undefined ? "" : ` ${token.annotation}`}${
        token.entry === undefined ? "" : ` ${token.entry}`
      }`
      : `${resourceName}/${token.name}${
        token.annotation === undefined ? "" : ` ${token.annotation}`
      }`;
    return heldBy({
      kind,
      entry: shorten(entry),
      reason: shorten(reason),
      ...(about.id === undefined ? {} : { id: about.id }),
      ...(about.key === undefined ? {} : { key: shorten(about.key) }),
      ...(about.node === undefined ? {} : { node: shorten(about.node) }),
      token: encodeToken(TAG, { ...token, store: storeOf(this.#ctx), kind }),
    }, holders);
  }

  /** An identity's own damage; a readable one joins `records`. */
  identity(obj: KubeObject, records: IdentityRecord[]): DamageFinding[] {
    const read = readIdentity(obj);
    const name = String(obj.metadata.name ?? "");
    const rv = String(obj.metadata.resourceVersion ?? "");
    if (!read.ok) {
      const { damage } = read;
      // Cilium's agents may use what idalloc cannot read: an endpoint naming it keeps it too.
      const holders = [
        ...this.#holders(obj.metadata.annotations ?? {}),
        ...(damage.id === undefined ? [] : this.#heldBy(damage.id)),
        ...(damage.id === undefined ? [] : this.#users.get(damage.id) ?? []),
      ];
      // Removing it removes the key's claim naming it too, when quiet (else the claim is stale).
      const claim = damage.id === undefined ? undefined : this.#claims.get(damage.id);
      const token = {
        what: "identity" as const,
        name,
        rv,
        ...(claim && this.#quiet(claim) ? { claim: { name: claim.name, rv: claim.rv } } : {}),
      };
      return [this.#finding(damage.kind, token, damage.reason, { id: damage.id }, holders)];
    }
    const { record, badRefs } = read;
    records.push(record);
    const about = { id: record.id, key: record.key };
    const out = badRefs.map((bad) => {
      const node = nodeOfRefAnnotation(bad.annotation);
      // Not a reference, but its node's: held while that node's Lease is live, whatever epoch
      // (the node is there and may write it again), as `deleteReference` refuses it.
      const live = node !== undefined &&
        leaseLive(this.#leases.get(node), this.#now, this.#ctx.settings.maxClockSkewMs);
      return this.#finding(
        node === undefined ? "reference-bad-key" : "reference-undecodable",
        { what: "annotation", name, annotation: bad.annotation, rv },
        bad.reason,
        about,
        live ? [node] : [],
      );
    });
    const check = this.#check;
    if (check === undefined || check.valid(record.id, record.key)) return out;
    for (const [node, epoch] of record.refs) {
      out.push(this.#finding(
        "reference-out-of-range",
        { what: "annotation", name, annotation: REF_PREFIX + node, rv },
        check.outside(record.id, record.key),
        { ...about, node },
        this.#live(node, epoch) ? [node] : [],
      ));
    }
    for (const [node, epoch] of this.#refs.get(record.id) ?? []) {
      const object = this.#refObjects.get(node)!;
      const legacy = object.legacy.includes(heldAnnotation(record.id));
      const where = legacy
        ? { annotation: heldAnnotation(record.id) }
        : { annotation: HELD_ANNOTATION, entry: `${record.id}=${epoch}` };
      out.push(this.#finding(
        "reference-out-of-range",
        { what: "held", name: object.name, ...where, rv: object.rv },
        check.outside(record.id, record.key),
        { ...about, node },
        this.#live(node, epoch) ? [node] : [],
      ));
    }
    return out;
  }

  /** The live nodes whose reference objects name identity `id`. */
  #heldBy(id: number): string[] {
    return [...this.#refs.get(id) ?? []].flatMap(([node, epoch]) =>
      this.#live(node, epoch) ? [node] : []
    );
  }

  /**
   * The entries of the nodes' reference objects that are no reference (an annotation under
   * `held.idalloc.io/` naming no ID, or without an epoch): held while the node's Lease is live.
   */
  referenceObjects(): DamageFinding[] {
    const { maxClockSkewMs } = this.#ctx.settings;
    return [...this.#refObjects.values()].flatMap((o) => {
      const live = leaseLive(this.#leases.get(o.node), this.#now, maxClockSkewMs);
      return o.bad.map((bad) =>
        this.#finding(
          bad.reason === "the epoch is empty" ? "reference-undecodable" : "reference-bad-key",
          {
            what: "held",
            name: o.name,
            annotation: bad.annotation,
            ...(bad.entry === undefined ? {} : { entry: bad.entry }),
            rv: o.rv,
          },
          bad.reason,
          { node: o.node },
          live ? [o.node] : [],
        )
      );
    });
  }

  /** Every identity of a key that is not Cilium's answer for it. */
  duplicates(records: readonly IdentityRecord[]): DamageFinding[] {
    const byKey = new Map<string, IdentityRecord[]>();
    for (const r of records) byKey.set(r.key, [...byKey.get(r.key) ?? [], r]);
    const out: DamageFinding[] = [];
    for (const [key, list] of byKey) {
      const answer = answerOf(list)!;
      for (const r of list) {
        if (r.id === answer.id) continue;
        out.push(this.#finding(
          "key-duplicate",
          { what: "identity", name: String(r.id), rv: r.rv },
          `the key also has identity ${answer.id}, Cilium's answer (the oldest)`,
          { id: r.id, key },
          this.#usedBy(r),
        ));
      }
    }
    return out;
  }

  /**
   * A claim that names nothing, or, once quiet, whose identity is gone or carries another key.
   */
  claim(obj: KubeObject): DamageFinding[] {
    const name = String(obj.metadata.name ?? "");
    const rv = String(obj.metadata.resourceVersion ?? "");
    const claim = readClaim(obj);
    if (claim === undefined) {
      return [
        this.#finding(
          "claim-undecodable",
          { what: "claim", name, rv },
          "it names no key or ID",
          {},
        ),
      ];
    }
    // Another identity resource's claim (the resource is hashed into the name): not ours.
    if (claimName(this.#ctx.resourceName, claim.key) !== name) return [];
    const reason = claimStaleness(claim, this.#holding.get(claim.id));
    if (reason === undefined || !this.#quiet(claim)) return [];
    return [this.#finding("claim-stale", { what: "claim", name, rv }, reason, {
      id: claim.id,
      key: claim.key,
    })];
  }

  /** A node Lease without a holder, an epoch or an end. */
  nodeLease(obj: KubeObject): DamageFinding[] {
    const lease = readNodeLease(obj);
    if (lease !== undefined && lease.epoch !== undefined && lease.expiresAt !== undefined) {
      return [];
    }
    const name = String(obj.metadata.name ?? "");
    return [this.#finding(
      "node-lease-undecodable",
      { what: "lease", name, rv: String(obj.metadata.resourceVersion ?? "") },
      "it has no holder, epoch or end",
      lease === undefined ? {} : { node: lease.node },
    )];
  }
}

/**
 * Removes the entry of `finding` if it is unchanged since it was listed (resource-version
 * precondition). Throws {@linkcode LiveEntryError} for a finding the listing found held, and
 * {@linkcode InvalidOptionsError} for a token of another store.
 */
export async function removeDamage(
  ctx: K8sContext,
  finding: Pick<DamageFinding, "token">,
  signal: AbortSignal,
): Promise<boolean> {
  const parsed = tokenSchema.safeParse(decodeToken(finding.token, TAG));
  if (!parsed.success) {
    throw new InvalidOptionsError("not a damage token of a Kubernetes store", {
      cause: parsed.error,
    });
  }
  const token = parsed.data;
  if (token.store !== storeOf(ctx)) {
    throw new InvalidOptionsError(
      `damage token of ${token.store}, not of this store (${storeOf(ctx)})`,
    );
  }
  const shown = token.what === "annotation" || token.what === "held"
    ? `${
      token.what === "held" ? ctx.namespace : ctx.resourceName
    }/${token.name} ${token.annotation}${token.entry === undefined ? "" : ` ${token.entry}`}`
    : `${token.what} ${token.name}`;
  if (token.held !== undefined) throw new LiveEntryError(shorten(shown), token.held);
  let removed: boolean;
  try {
    switch (token.what) {
      case "identity":
        removed = await ctx.client.delete(ctx.identities, token.name, {
          resourceVersion: token.rv,
          signal,
        });
        if (removed && token.claim !== undefined) await dropListedClaim(ctx, token.claim, signal);
        break;
      case "annotation":
        await ctx.client.patch(ctx.identities, token.name, {
          metadata: { resourceVersion: token.rv, annotations: { [token.annotation ?? ""]: null } },
        }, { type: "merge", signal });
        removed = true;
        break;
      case "held":
        removed = await removeHeld(ctx, token, signal);
        break;
      case "claim":
      case "lease":
        removed = await ctx.client.delete(LEASES, token.name, {
          namespace: ctx.namespace,
          resourceVersion: token.rv,
          signal,
        });
        break;
    }
  } catch (err) {
    if (!isStatus(err, 409) && !isStatus(err, 404)) throw err;
    removed = false;
  }
  log.info("{what} damaged entry {entry} ({kind})", {
    what: removed ? "removed" : "entry changed since it was listed; kept",
    entry: shorten(shown),
    kind: token.kind,
  });
  return removed;
}

/**
 * Removes one entry of a node's reference object under the version it was listed at: an
 * annotation of the earlier layout, or one entry of the packed list (the list rewritten without
 * it; an object changed since is refused, as the guarded patch would refuse it).
 */
async function removeHeld(ctx: K8sContext, token: Token, signal: AbortSignal): Promise<boolean> {
  let annotations: Record<string, string | null> | undefined = { [token.annotation ?? ""]: null };
  if (token.entry !== undefined) {
    const obj = await ctx.client.get(LEASES, token.name, { namespace: ctx.namespace, signal });
    const record = obj === undefined ? undefined : readNodeRefs(obj);
    if (record === undefined || record.rv !== token.rv) return false;
    annotations = heldRemovalPatch(record, { entries: new Set([token.entry]) });
    if (annotations === undefined) return false;
  }
  await ctx.client.patch(LEASES, token.name, {
    metadata: { resourceVersion: token.rv, annotations },
  }, { type: "merge", namespace: ctx.namespace, signal });
  return true;
}

/**
 * Deletes the claim of a damaged identity just removed, guarded by its version as listed (quiet
 * then: a node that touched it since to re-create the identity changed that version).
 */
async function dropListedClaim(
  ctx: K8sContext,
  claim: { readonly name: string; readonly rv: string },
  signal: AbortSignal,
): Promise<void> {
  try {
    await ctx.client.delete(LEASES, claim.name, {
      namespace: ctx.namespace,
      resourceVersion: claim.rv,
      signal,
    });
  } catch (err) {
    if (!isStatus(err, 409)) throw err;
  }
}
