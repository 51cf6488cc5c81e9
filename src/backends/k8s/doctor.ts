/**
 * The damage report on Kubernetes ({@linkcode StoreDoctor}): one consistent list of the
 * identities, then the Leases of the namespace, reporting what idalloc (and Cilium) cannot use,
 * and a removal guarded by the listed resource version.
 *
 * Reported:
 * - identities named not as a decimal ID (`master-bad-id`) or whose `security-labels` do not
 *   decode (`master-undecodable`);
 * - reference annotations that name no node or no epoch (`reference-bad-key`,
 *   `reference-undecodable`), and (with valid ranges) references on an identity outside them
 *   (`reference-out-of-range`);
 * - keys with several identities (`key-duplicate`, one finding per identity that is not Cilium's
 *   answer: the oldest stays; removing a duplicate deletes it);
 * - claims that name no key or ID (`claim-undecodable`) or whose identity is gone or carries
 *   another key (`claim-stale`);
 * - node Leases without an epoch or an end (`node-lease-undecodable`).
 *
 * Each finding names the live nodes holding it (their live references on the identity); such a
 * finding is refused by {@linkcode removeDamage} with `LiveEntryError`.
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
  rangeCheck,
  shorten,
} from "../../allocator/damage.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { isStatus, type KubeObject } from "./kube.ts";
import {
  answerOf,
  CLAIM_SELECTOR,
  claimName,
  type IdentityRecord,
  NODE_SELECTOR,
  nodeLeaseName,
  type NodeLeaseRecord,
  nodeOfRefAnnotation,
  readClaim,
  readIdentity,
  readNodeLease,
  REF_PREFIX,
} from "./layout.ts";
import { refLive } from "./liveness.ts";
import { LEASES } from "./options.ts";
import { listAll } from "./paging.ts";

const log = idallocLogger("k8s", "doctor");

/** The token's backend tag. */
const TAG = "k8s";

const tokenSchema = z.object({
  /** What the entry is: an identity, one annotation of it, a claim or a node Lease. */
  what: z.enum(["identity", "annotation", "claim", "lease"]),
  /** The store: the identity resource and the namespace. */
  store: z.string(),
  name: z.string().min(1),
  annotation: z.string().optional(),
  rv: z.string(),
  kind: z.string(),
  held: z.array(z.string()).optional(),
}).strict();

type Token = z.infer<typeof tokenSchema>;

function storeOf(ctx: K8sContext): string {
  return `${ctx.resourceName}@${ctx.namespace}`;
}

/** The live nodes whose references (by annotation, however malformed the rest) name `obj`. */
function holdersOf(
  obj: KubeObject,
  leases: ReadonlyMap<string, NodeLeaseRecord>,
  now: number,
  skew: number,
): string[] {
  const out: string[] = [];
  for (const [annotation, epoch] of Object.entries(obj.metadata.annotations ?? {})) {
    const node = nodeOfRefAnnotation(annotation);
    if (node !== undefined && refLive(epoch, leases.get(node), now, skew)) out.push(node);
  }
  return out;
}

/** Lists the damaged entries of the store (see the module doc). Reads only. */
export async function* findDamage(
  ctx: K8sContext,
  options: DamageScanOptions = {},
): AsyncGenerator<DamageFinding> {
  const signal = options.signal ?? new AbortController().signal;
  const check = rangeCheck(options);
  const store = storeOf(ctx);
  const { items } = await listAll(ctx.client, ctx.identities, { signal });
  const leaseObjs = (await listAll(ctx.client, LEASES, {
    namespace: ctx.namespace,
    labelSelector: NODE_SELECTOR,
    signal,
  })).items;
  const leases = new Map<string, NodeLeaseRecord>();
  for (const obj of leaseObjs) {
    const l = readNodeLease(obj);
    if (l !== undefined && l.name === nodeLeaseName(l.node)) leases.set(l.node, l);
  }
  const now = ctx.settings.now();
  const skew = ctx.settings.maxClockSkewMs;
  const entry = (name: string, annotation?: string) =>
    shorten(`${ctx.resourceName}/${name}${annotation === undefined ? "" : ` ${annotation}`}`);
  const finding = (
    kind: DamageKind,
    token: Omit<Token, "store" | "kind">,
    reason: string,
    about: { id?: number; key?: string; node?: string },
    holders: readonly string[] = [],
  ): DamageFinding =>
    heldBy({
      kind,
      entry: token.what === "claim" || token.what === "lease"
        ? shorten(`${ctx.namespace}/${token.name}`)
        : entry(token.name, token.annotation),
      reason: shorten(reason),
      ...(about.id === undefined ? {} : { id: about.id }),
      ...(about.key === undefined ? {} : { key: shorten(about.key) }),
      ...(about.node === undefined ? {} : { node: shorten(about.node) }),
      token: encodeToken(TAG, { ...token, store, kind }),
    }, holders);

  const records: IdentityRecord[] = [];
  for (const obj of items) {
    const read = readIdentity(obj);
    const name = String(obj.metadata.name ?? "");
    const rv = String(obj.metadata.resourceVersion ?? "");
    const holders = holdersOf(obj, leases, now, skew);
    if (!read.ok) {
      const { damage } = read;
      yield finding(damage.kind, { what: "identity", name, rv }, damage.reason, {
        id: damage.id,
      }, holders);
      continue;
    }
    const { record, badRefs } = read;
    records.push(record);
    for (const bad of badRefs) {
      const kind = nodeOfRefAnnotation(bad.annotation) === undefined
        ? "reference-bad-key"
        : "reference-undecodable";
      yield finding(
        kind,
        { what: "annotation", name, annotation: bad.annotation, rv },
        bad.reason,
        {
          id: record.id,
          key: record.key,
        },
      );
    }
    if (check !== undefined && !check.valid(record.id, record.key)) {
      for (const [node, epoch] of record.refs) {
        const live = refLive(epoch, leases.get(node), now, skew);
        yield finding(
          "reference-out-of-range",
          { what: "annotation", name, annotation: REF_PREFIX + node, rv },
          check.outside(record.id, record.key),
          { id: record.id, key: record.key, node },
          live ? [node] : [],
        );
      }
    }
  }

  const byKey = new Map<string, IdentityRecord[]>();
  for (const r of records) {
    const list = byKey.get(r.key);
    if (list === undefined) byKey.set(r.key, [r]);
    else list.push(r);
  }
  for (const [key, list] of byKey) {
    if (list.length < 2) continue;
    const answer = answerOf(list)!;
    for (const r of list) {
      if (r.id === answer.id) continue;
      const holders = [...r.refs].filter(([node, epoch]) =>
        refLive(epoch, leases.get(node), now, skew)
      ).map(([node]) => node);
      yield finding(
        "key-duplicate",
        { what: "identity", name: String(r.id), rv: r.rv },
        `the key also has identity ${answer.id}, Cilium's answer (the oldest)`,
        { id: r.id, key },
        holders,
      );
    }
  }

  const byId = new Map(records.map((r) => [r.id, r]));
  const claims = (await listAll(ctx.client, LEASES, {
    namespace: ctx.namespace,
    labelSelector: CLAIM_SELECTOR,
    signal,
  })).items;
  for (const obj of claims) {
    const name = String(obj.metadata.name ?? "");
    const rv = String(obj.metadata.resourceVersion ?? "");
    const claim = readClaim(obj);
    if (claim === undefined) {
      yield finding("claim-undecodable", { what: "claim", name, rv }, "it names no key or ID", {});
      continue;
    }
    // Another identity resource's claim (the resource is hashed into the name): not ours.
    if (claimName(ctx.resourceName, claim.key) !== name) continue;
    const identity = byId.get(claim.id);
    if (identity?.key === claim.key) continue;
    yield finding(
      "claim-stale",
      { what: "claim", name, rv },
      identity === undefined
        ? `identity ${claim.id} does not exist`
        : `identity ${claim.id} carries another key`,
      { id: claim.id, key: claim.key },
    );
  }

  for (const obj of leaseObjs) {
    const lease = readNodeLease(obj);
    if (lease !== undefined && lease.epoch !== undefined && lease.expiresAt !== undefined) continue;
    const name = String(obj.metadata.name ?? "");
    yield finding(
      "node-lease-undecodable",
      { what: "lease", name, rv: String(obj.metadata.resourceVersion ?? "") },
      "it has no holder, epoch or end",
      lease === undefined ? {} : { node: lease.node },
    );
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
  const shown = token.what === "annotation"
    ? `${ctx.resourceName}/${token.name} ${token.annotation}`
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
        break;
      case "annotation":
        await ctx.client.patch(ctx.identities, token.name, {
          metadata: { resourceVersion: token.rv, annotations: { [token.annotation ?? ""]: null } },
        }, { type: "merge", signal });
        removed = true;
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
