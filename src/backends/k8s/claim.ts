/**
 * The key claim's guard against duplicates. Kubernetes has no transaction across two objects, so
 * the claim Lease (`idalloc-key-<hash>`: key K → ID M) and the identity M it names are written one
 * after the other; these rules make sure no idalloc node ever gives K a second identity itself.
 *
 * **Who changes a claim.** A node creates it (new key), moves it to a new ID under its resource
 * version (its ID carries another key), or touches it (below); GC and the doctor delete it under
 * its resource version once its identity is gone and the claim is quiet ({@linkcode claimQuiet},
 * judged at a time taken before the identities were read). A node creates identity M only right
 * after its own guarded write of the claim (create, move or touch) confirmed K → M.
 *
 * **Race 1: a claim removed while a node re-creates its identity.** M of K is gone (GC collected
 * it, someone deleted it), the claim K → M stays a moment; node X, following it, creates M again.
 * Had GC deleted the claim in between, a node Z not seeing M yet would claim K anew and create P:
 * two identities. So a re-creation first **touches** the claim: a merge patch guarded by the
 * version X read, changing a nonce ({@linkcode touchPatch}). GC's delete is guarded by the version
 * GC read. Whichever lands second is refused: X's touch (404: the claim is gone → X takes the
 * new-key path), or GC's delete (409: the claim stays, naming the M that X creates).
 *
 * **Race 2: a node stalled between its claim write and its identity create.** X confirmed K → M,
 * then stalled; meanwhile M was created by another node, released, collected with its claim, and
 * K claimed anew under P. X's create of M would then succeed beside P. Both ways the claim can
 * stop naming K → M after X's write take time:
 * - through GC: the identity it names must be created after X's decision, found unused, marked
 *   and deleted a grace later. The grace is at least the longest lease TTL of any node (the
 *   allocator's rule for `gcGraceMs`, enforced by the CLI), less the clock skew between the
 *   marker and the deleter, so a GC cycle takes at least `ttl − skew ≥ ttl / 2` (the TTL is at
 *   least twice the skew);
 * - through a claim removal of its own (GC's sweep, the doctor): only a claim whose last write
 *   is older than {@linkcode claimQuietMs} (half the heartbeat timeout, plus the skew between the
 *   writer's clock and the remover's) is removed, and every node's TTL is below the heartbeat
 *   timeout (checked when a session opens).
 * So a node whose claim write and identity create lie within {@linkcode confirmAfterMs} (half its
 * lease TTL, measured on its own monotonic clock from the start of the call, before anything it
 * decided on was read) creates M while the claim still names K → M, and answers at once: 2 round
 * trips for a new key. One that took longer re-confirms the claim after the create with another
 * guarded touch ({@linkcode confirmClaim}), which, like race 1, excludes a concurrent removal; if
 * the claim is gone or names another ID, it removes the identity it just created, under the
 * version its create returned ({@linkcode retract}), and starts over from the claim. No answer is
 * ever given from an identity created while the claim may have named something else.
 *
 * **Looking before creating (beside Cilium's agents).** The claim orders idalloc's creates only:
 * Cilium's agents create identities without it, and a node learns of theirs only from its
 * informer. So where the informer is not provably current (`view_freshness.ts`), `acquire` reads the
 * key's identities from the store (a consistent list) right before it would create one, and joins
 * the oldest it finds instead. That step only ever turns a create into a join, never adds one, so
 * the argument above is unchanged: every identity an idalloc node creates still follows its own
 * guarded write of the claim within {@linkcode confirmAfterMs} of the call's start (the read counts
 * against that time) or is confirmed afterwards, and no idalloc node ever gives a key a second
 * identity itself.
 *
 * Left open (documented): an identity that exists but that the node's informer has not shown yet,
 * which GC deletes within the node's two writes while another node moves the claim off it; and
 * allocators with different ranges on one store, one of which moves a claim whose ID lies outside
 * its range at once.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { claimNames, claimQuiet, confirmAfterMs } from "./claim.ts";
 *
 * assert.equal(confirmAfterMs(15_000), 7_500);
 * const settings = { heartbeatTimeoutMs: 60_000, maxClockSkewMs: 1_000 };
 * assert.equal(claimQuiet({ writtenAt: 100_000 }, 131_001, settings), true);
 * assert.equal(claimQuiet({ writtenAt: 100_000 }, 131_000, settings), false);
 * assert.equal(claimQuiet({}, 0, settings), true, "hand-made: no write time");
 * assert.equal(claimNames({ name: "c", key: "k", id: 7, rv: "1" }, "k", 7), true);
 * assert.equal(claimNames(undefined, "k", 7), false);
 * ```
 *
 * @module
 */
import { idallocLogger } from "../../log.ts";
import type { K8sContext } from "./context.ts";
import { isStatus, type KubeClient, type KubeObject, unlessRefused } from "./kube.ts";
import {
  claimName,
  type ClaimRecord,
  microTime,
  readClaim,
  readIdentity,
  TOUCH_ANNOTATION,
} from "./layout.ts";
import type { K8sSettings } from "./options.ts";
import { LEASES } from "./options.ts";

const log = idallocLogger("k8s");

/** Guarded rounds of a confirmation or a retraction before it gives up (the safe way). */
const ROUNDS = 3;

/**
 * How long after a call started a node may create an identity from its claim without confirming
 * the claim again afterwards: half its lease TTL (see the module doc).
 */
export function confirmAfterMs(leaseTtlMs: number): number {
  return Math.floor(leaseTtlMs / 2);
}

/**
 * How old a claim's last write must be (on the remover's clock) before GC or the doctor removes
 * it: half the heartbeat timeout, above every node's {@linkcode confirmAfterMs}, plus the skew
 * between the writer's clock and the remover's.
 */
export function claimQuietMs(
  settings: Pick<K8sSettings, "heartbeatTimeoutMs" | "maxClockSkewMs">,
): number {
  return Math.ceil(settings.heartbeatTimeoutMs / 2) + settings.maxClockSkewMs;
}

/**
 * Whether `claim` may be removed at `now`: no node can be between writing it and creating its
 * identity unconfirmed. A claim without a write time was not written by an idalloc node that
 * creates identities from it unconfirmed (hand-made, or older): it may.
 */
export function claimQuiet(
  claim: Pick<ClaimRecord, "writtenAt">,
  now: number,
  settings: Pick<K8sSettings, "heartbeatTimeoutMs" | "maxClockSkewMs">,
): boolean {
  return claim.writtenAt === undefined || now - claim.writtenAt > claimQuietMs(settings);
}

/** Whether `claim` (as read; `undefined`: gone or unreadable) names `key` → `id`. */
export function claimNames(claim: ClaimRecord | undefined, key: string, id: number): boolean {
  return claim !== undefined && claim.key === key && claim.id === id;
}

/**
 * Why `claim` is stale, given what its ID holds: `undefined` no identity, `null` a damaged one,
 * else the key it carries. A claim naming a damaged identity is not stale: the identity's own
 * damage is the finding, and repairing it needs the claim. `undefined` when it is not stale.
 */
export function claimStaleness(
  claim: ClaimRecord,
  holder: string | null | undefined,
): string | undefined {
  if (holder === null || holder === claim.key) return undefined;
  return holder === undefined
    ? `identity ${claim.id} does not exist`
    : `identity ${claim.id} carries another key`;
}

/** A random nonce, so that every touch changes the claim (a no-op patch keeps its version). */
function nonce(): string {
  return crypto.randomUUID().slice(0, 8);
}

/**
 * The touch of a claim: only if it is still at `rv` (409 when it changed, 404 when it is gone),
 * a new nonce and write time, and `node` as its holder; what it names stays.
 */
export function touchPatch(rv: string, node: string, now: number): unknown {
  return {
    metadata: { resourceVersion: rv, annotations: { [TOUCH_ANNOTATION]: nonce() } },
    spec: { holderIdentity: node, renewTime: microTime(now) },
  };
}

/**
 * Touches the claim `name` at `rv`: its new resource version, or `undefined` when it changed or
 * is gone since.
 */
export async function touchClaim(
  client: KubeClient,
  ctx: K8sContext,
  name: string,
  rv: string,
  signal: AbortSignal,
): Promise<string | undefined> {
  const body = touchPatch(rv, ctx.node, ctx.settings.now());
  const touched = await unlessRefused(
    client.patch(LEASES, name, body, { type: "merge", namespace: ctx.namespace, signal }),
    409,
    404,
  );
  return touched === undefined ? undefined : String(touched.metadata.resourceVersion ?? "");
}

/**
 * Confirms, after creating identity `id` of `key`, that the claim still names it: a touch at
 * `rv` (the version of this node's last write of it), or, when someone else wrote it since, a
 * read and a touch at the version read while it still names `key` → `id`. `false`: the claim is
 * gone or names something else (or kept changing: the safe answer).
 */
export async function confirmClaim(
  client: KubeClient,
  ctx: K8sContext,
  key: string,
  id: number,
  rv: string,
  signal: AbortSignal,
): Promise<boolean> {
  const name = claimName(ctx.resourceName, key);
  for (let round = 0; round < ROUNDS; round++) {
    if (await touchClaim(client, ctx, name, rv, signal) !== undefined) return true;
    const obj = await client.get(LEASES, name, { namespace: ctx.namespace, signal });
    const claim = obj === undefined ? undefined : readClaim(obj);
    if (!claimNames(claim, key, id)) return false;
    rv = claim!.rv;
  }
  return false;
}

/**
 * Removes identity `created` of `key`, which this node just created and could not confirm (see the
 * module doc): a delete guarded by its version; when it changed meanwhile and still carries the
 * key, again at the new version. When another node references it too (an annotation of the older
 * layout, or it joined through its reference object unseen here), it loses the identity as it
 * would to GC: the allocator's master-key protection re-creates it through the claim rule, which
 * now names another ID, so that node moves to it (`refs.ts`, case 3). The caller drops its own
 * reference to it. Gives up after a few rounds (the identity stays, a duplicate GC collects once
 * unused).
 */
export async function retract(
  client: KubeClient,
  ctx: K8sContext,
  created: KubeObject,
  key: string,
  signal: AbortSignal,
): Promise<void> {
  const name = String(created.metadata.name);
  let rv = String(created.metadata.resourceVersion ?? "");
  for (let round = 0; round < ROUNDS; round++) {
    try {
      await client.delete(ctx.identities, name, { resourceVersion: rv, signal });
      return;
    } catch (err) {
      if (!isStatus(err, 409)) throw err;
    }
    const obj = await client.get(ctx.identities, name, { signal });
    const read = obj === undefined ? undefined : readIdentity(obj);
    if (read === undefined || !read.ok || read.record.key !== key) return;
    const others = [...read.record.refs.keys()].filter((node) => node !== ctx.node);
    if (others.length > 0) {
      log.warning("identity {name} of {key} was joined by {others} before it could be removed", {
        name,
        key,
        others,
      });
      return;
    }
    rv = read.record.rv;
  }
  log.warning("identity {name} of {key} kept changing: left for GC", { name, key });
}
