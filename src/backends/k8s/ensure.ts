/**
 * `ensure` on Kubernetes, in phases: **look** at each held key's identity in the informer's index
 * (no request) and at this node's reference object as last written; what is fine there needs
 * nothing, and references missing or of an older epoch are **staged** for all keys at once and
 * stored in one write of the node's reference object (`refs.ts`). Only a key the index shows
 * wrong (its identity missing, marked, of another key, not Cilium's answer), or any key while the
 * informer's watch is failing, is **read** (one GET each, a few at a time), **classified**,
 * **planned** and **applied**; a write that meets a changed object reads it again and classifies
 * anew. So a node that holds its keys sends nothing at a sync: only its Lease renewals.
 *
 * A held key K → N is `ok` when identity N exists, carries K, is Cilium's answer for K (no older
 * identity of K), carries no GC mark, and this node's reference object holds N under the current
 * epoch. Then:
 * - reference missing or of an older epoch → staged, one write for every such key
 *   (`reference: recreated`); a mark set → one patch removing it (after the reference is stored);
 * - identity missing → re-created under N, only through the claim rule: the key's claim names N
 *   (touched first, under the version read), is absent (then it is created naming N) or names
 *   nothing readable (rewritten to name N); a re-creation slower than half a lease TTL confirms
 *   the claim again or removes what it created (`claim.ts`) — `master: recreated`;
 * - N's labels do not decode but it carries idalloc references (damaged: someone edited it) and
 *   the claim names N or is absent → its labels written again under its resource version, with
 *   this node's reference (`master: recreated`);
 * - N carries another key (or cannot be read otherwise), an older identity of K exists, the claim
 *   names another ID, or N was taken while re-creating it → `conflict` (nothing written; the
 *   allocator re-acquires K, which joins Cilium's answer, and announces `reassigned`). When N
 *   now carries a key this session holds no reference to (relabelled under it), this node's
 *   reference is removed from N first, guarded by the version read.
 *
 * @module
 */
import type { EnsureReport, HeldKey } from "../../allocator/backend.ts";
import { ConflictError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { patchOrUndefined } from "./acquire.ts";
import { confirmAfterMs, confirmClaim, retract, touchClaim } from "./claim.ts";
import type { K8sContext } from "./context.ts";
import { rvOf, unlessRefused } from "./kube.ts";
import {
  answerOf,
  claimName,
  claimObject,
  type ClaimRecord,
  type IdentityRead,
  type IdentityRecord,
  readClaim,
  readIdentity,
} from "./layout.ts";
import type { LeaseKeeper } from "./lease.ts";
import { ENSURE_CONCURRENCY, MAX_ENSURE_ROUNDS } from "./limits.ts";
import { createMaster } from "./master.ts";
import { LEASES } from "./options.ts";
import { guardedMergePatch, joinPatch, releasePatch, repairPatch } from "./patch.ts";
import type { RefKeeper } from "./refs.ts";
import type { IdentityInformer } from "./watch.ts";

const log = idallocLogger("k8s");

/** What one held key needs. */
export type EnsurePlan =
  | { readonly kind: "ok" }
  /** The reference is missing or old, or the identity is marked: patch it. */
  | { readonly kind: "reference"; readonly annotated: boolean }
  /** The identity is missing: re-create it through the claim rule. */
  | { readonly kind: "recreate" }
  /** The identity (at `rv`) is idalloc's but its labels do not decode: write them again. */
  | { readonly kind: "repair"; readonly rv: string; readonly annotated: boolean }
  | { readonly kind: "conflict"; readonly why: string };

/**
 * Classifies held `held` from its identity as read (`undefined`: missing), the index's identities
 * of the key (`others`; the read one may be among them, older or newer), and whether this node's
 * reference object holds the ID under the current epoch (`referenced`).
 */
export function classifyHeld(
  held: HeldKey,
  read: IdentityRead | undefined,
  others: readonly Pick<IdentityRecord, "id" | "created">[],
  referenced: boolean,
): EnsurePlan {
  if (read === undefined) {
    const answer = answerOf(others.filter((r) => r.id !== held.id));
    return answer === undefined
      ? { kind: "recreate" }
      : { kind: "conflict", why: `identity ${held.id} is gone and the key has ${answer.id}` };
  }
  if (!read.ok) {
    const { kind, referenced, rv, annotated } = read.damage;
    return kind === "master-undecodable" && referenced
      ? { kind: "repair", rv, annotated }
      : { kind: "conflict", why: `identity ${held.id} cannot be read` };
  }
  const record = read.record;
  if (record.key !== held.key) {
    return { kind: "conflict", why: `identity ${held.id} carries another key` };
  }
  const answer = answerOf([...others.filter((r) => r.id !== held.id), record]);
  if (answer !== undefined && answer.id !== held.id) {
    return { kind: "conflict", why: `identity ${answer.id} of the key is older (Cilium's answer)` };
  }
  if (referenced && record.mark === undefined) return { kind: "ok" };
  return { kind: "reference", annotated: record.annotated };
}

/**
 * Whether the key's claim as read lets this node re-create identity `id` of `key`: absent (then it
 * is created naming `id`) or naming `id`. Another ID named is a conflict.
 */
export function claimAllows(claim: ClaimRecord | undefined, key: string, id: number): boolean {
  return claim === undefined || (claim.key === key && claim.id === id);
}

/** What `ensure` works with. */
export interface EnsureParts {
  readonly ctx: K8sContext;
  readonly lease: LeaseKeeper;
  readonly informer: IdentityInformer;
  /** The node's reference object. */
  readonly refs: RefKeeper;
  /** Whether the informer's watch is answering (else every held key is read with a GET). */
  readonly fresh: () => boolean;
  /**
   * The keys the session may hold a reference to: a reference of this node on an identity that
   * now carries a key not among them is left over from a relabelled identity, and removed.
   */
  readonly referenced?: ReadonlySet<string>;
}

/** Runs `ensure` for `held` (see the module doc). */
export async function ensure(
  parts: EnsureParts,
  held: readonly HeldKey[],
  signal: AbortSignal,
): Promise<EnsureReport[]> {
  await parts.informer.waitSynced(signal);
  await parts.lease.ensureFresh(signal);
  const reports: (EnsureReport | undefined)[] = parts.fresh()
    ? await fromIndex(parts, held, signal)
    : new Array(held.length);
  const rest = held.flatMap((_, i) => (reports[i] === undefined ? [i] : []));
  let next = 0;
  const worker = async () => {
    while (next < rest.length) {
      const i = rest[next++];
      reports[i] = await ensureOne(parts, held[i], signal);
    }
  };
  await Promise.all(Array.from({ length: Math.min(ENSURE_CONCURRENCY, rest.length) }, worker));
  return reports as EnsureReport[];
}

/**
 * The held keys the index shows fine (its identity there, of the key, Cilium's answer, unmarked):
 * `ok`, or, when this node's reference object lacks the reference under the current epoch,
 * staged and stored in one write for all (`reference: recreated`). `undefined` for the others:
 * they are read.
 */
async function fromIndex(
  parts: EnsureParts,
  held: readonly HeldKey[],
  signal: AbortSignal,
): Promise<(EnsureReport | undefined)[]> {
  const { lease, informer, refs } = parts;
  const epoch = lease.epoch;
  let staged = 0;
  const reports = held.map((h): EnsureReport | undefined => {
    const record = informer.index.get(h.id);
    if (record === undefined) return undefined;
    const read = { ok: true as const, record, badRefs: [] };
    const others = informer.index.ofKey(h.key);
    const plan = classifyHeld(h, read, others, refs.holds(h.id, epoch));
    if (plan.kind === "ok") return { ...h, master: "ok", reference: "ok" };
    if (plan.kind !== "reference" || record.mark !== undefined) return undefined;
    refs.stage(h.id, h.key, epoch);
    staged++;
    return { ...h, master: "ok", reference: "recreated" };
  });
  if (staged > 0) await refs.flush(signal);
  return reports;
}

async function ensureOne(
  parts: EnsureParts,
  held: HeldKey,
  signal: AbortSignal,
): Promise<EnsureReport> {
  const { ctx, lease, informer, refs } = parts;
  for (let round = 0; round < MAX_ENSURE_ROUNDS; round++) {
    const since = performance.now();
    const obj = await ctx.client.get(ctx.identities, String(held.id), { signal });
    if (obj !== undefined) informer.observe(obj);
    const read = obj === undefined ? undefined : readIdentity(obj);
    const epoch = lease.epoch;
    const others = informer.index.ofKey(held.key);
    const plan = classifyHeld(held, read, others, refs.holds(held.id, epoch));
    switch (plan.kind) {
      case "ok":
        return { ...held, master: "ok", reference: "ok" };
      case "conflict":
        log.warning("cannot ensure {key} → {id}: {why}", { ...held, why: plan.why });
        if (read?.ok) await leaveRelabelled(parts, read.record, signal);
        return { ...held, master: "conflict", reference: "skipped" };
      case "reference": {
        // Reference first, then the mark (`refs.ts`).
        await refs.hold(held.id, held.key, epoch, signal);
        const record = read!.ok ? read!.record : undefined;
        if (record?.mark !== undefined || record?.leaseNamespace === undefined) {
          const ops = joinPatch(held.key, plan.annotated, ctx.namespace);
          const written = await patchOrUndefined(ctx.client, ctx, held.id, ops, signal);
          if (written === undefined) continue;
          informer.observe(written);
        }
        return { ...held, master: "ok", reference: "recreated" };
      }
      case "repair": {
        const outcome = await repair(parts, held, { ...plan, epoch }, signal);
        if (outcome === "again") continue;
        if (outcome === "conflict") return { ...held, master: "conflict", reference: "skipped" };
        return { ...held, master: "recreated", reference: "recreated" };
      }
      case "recreate": {
        const outcome = await recreate(parts, held, { epoch, since }, signal);
        if (outcome === "again") continue;
        if (outcome === "conflict") return { ...held, master: "conflict", reference: "skipped" };
        return { ...held, master: "recreated", reference: "recreated" };
      }
    }
  }
  throw new ConflictError(`could not ensure key '${held.key}': the store kept changing`);
}

/**
 * Drops this node's reference to `record` when it carries a key this session does not hold (it
 * was relabelled under the node: the reference was to the old key, which the allocator now
 * re-acquires elsewhere), so that it does not keep a foreign key in use and show this node as its
 * holder. A reference of the older layout (an annotation of this node) is removed too, guarded by
 * the version read: a write since keeps it; a failure leaves it to GC's sweep once the node is
 * gone.
 */
async function leaveRelabelled(
  parts: EnsureParts,
  record: IdentityRecord,
  signal: AbortSignal,
): Promise<void> {
  const { ctx, informer, referenced, refs } = parts;
  if (referenced === undefined || referenced.has(record.key)) return;
  if (refs.wants(record.id)) {
    refs.forget(record.id);
    await refs.flush(signal);
    log.info("dropped this node's reference to identity {id}, relabelled to {key}", {
      id: record.id,
      key: record.key,
    });
  }
  if (!record.refs.has(ctx.node)) return;
  const ops = [
    { op: "test" as const, path: "/metadata/resourceVersion", value: record.rv },
    ...releasePatch(record.key, ctx.node),
  ];
  try {
    const written = await unlessRefused(
      ctx.client.patch(ctx.identities, String(record.id), ops, { type: "json", signal }),
      409,
      404,
      422,
    );
    if (written !== undefined) informer.observe(written);
  } catch (err) {
    if (signal.aborted) throw err;
    log.warning("could not remove this node's reference from relabelled identity {id}: {err}", {
      id: record.id,
      err,
    });
  }
}

/**
 * Repairs identity `held.id` (at `at.rv`), whose labels do not decode, when the key's claim names
 * it or is absent. `again`: it changed meanwhile.
 */
async function repair(
  parts: EnsureParts,
  held: HeldKey,
  at: { readonly rv: string; readonly annotated: boolean; readonly epoch: string },
  signal: AbortSignal,
): Promise<"repaired" | "conflict" | "again"> {
  const { ctx, informer, refs } = parts;
  const name = claimName(ctx.resourceName, held.key);
  const found = await ctx.client.get(LEASES, name, { namespace: ctx.namespace, signal });
  if (found !== undefined && !claimAllows(readClaim(found), held.key, held.id)) {
    log.warning("cannot repair {key} → {id}: its claim names another ID", { ...held });
    return "conflict";
  }
  await refs.hold(held.id, held.key, at.epoch, signal);
  const ops = repairPatch(held.key, at.rv, at.annotated, ctx.namespace);
  const written = await patchOrUndefined(ctx.client, ctx, held.id, ops, signal);
  if (written === undefined) return "again";
  informer.observe(written);
  log.warning("repaired the labels of held identity {id} of {key}", { ...held });
  return "repaired";
}

/**
 * Re-creates identity `held.id` of `held.key` through the claim rule, `since` (monotonic ms) the
 * read it was decided on. `again`: the claim or the identity changed meanwhile (a racing
 * re-creation): read and classify it again.
 */
async function recreate(
  parts: EnsureParts,
  held: HeldKey,
  at: { readonly epoch: string; readonly since: number },
  signal: AbortSignal,
): Promise<"created" | "conflict" | "again"> {
  const { ctx, informer, lease, refs } = parts;
  // The reference beside the claim write, as a new key's (`acquire.ts`).
  const [claimRv] = await Promise.all([
    writeClaim(ctx, held, signal),
    refs.hold(held.id, held.key, at.epoch, signal),
  ]);
  if (claimRv === "conflict" || claimRv === undefined) return claimRv ?? "again";
  const master = { id: held.id, key: held.key, epoch: at.epoch };
  const created = await createMaster(ctx.client, ctx, master, signal);
  // Taken meanwhile (a racing re-creation): read it again.
  if (created === undefined) return "again";
  if (
    performance.now() - at.since > confirmAfterMs(lease.ttlMs) &&
    !await confirmClaim(ctx.client, ctx, held.key, held.id, claimRv, signal)
  ) {
    await retract(ctx.client, ctx, created, held.key, signal);
    log.warning("cannot re-create {key} → {id}: its claim changed meanwhile", { ...held });
    return "conflict";
  }
  informer.observe(created);
  return "created";
}

/**
 * This node's write of the key's claim naming `held.id` before re-creating it: a touch of one
 * that names it, a create when there is none, a guarded rewrite of one that names nothing
 * readable. Returns the claim's new version, `conflict` when it names another ID, `undefined`
 * when it changed under the write.
 */
async function writeClaim(
  ctx: K8sContext,
  held: HeldKey,
  signal: AbortSignal,
): Promise<string | "conflict" | undefined> {
  const name = claimName(ctx.resourceName, held.key);
  const namespace = ctx.namespace;
  const found = await ctx.client.get(LEASES, name, { namespace, signal });
  const claim = found === undefined ? undefined : readClaim(found);
  if (found !== undefined && !claimAllows(claim, held.key, held.id)) {
    log.warning("cannot re-create {key} → {id}: its claim names another ID", { ...held });
    return "conflict";
  }
  if (claim !== undefined) return await touchClaim(ctx.client, ctx, name, claim.rv, signal);
  const fresh = claimObject(name, held.key, held.id, ctx.node, ctx.settings.now());
  const written = await unlessRefused(
    found === undefined
      ? ctx.client.create(LEASES, fresh, { namespace, signal })
      : ctx.client.patch(LEASES, name, guardedMergePatch(fresh, rvOf(found)), {
        type: "merge",
        namespace,
        signal,
      }),
    409,
    404,
  );
  return written === undefined ? undefined : rvOf(written);
}
