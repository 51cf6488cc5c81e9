/**
 * GC of a double-write store, on the kvstore side as in Cilium (`RunGC` is the kvstore
 * backend's), with the CRD side's verdict added: a kvstore master is a candidate only when its
 * CRD twin is unused too (no live idalloc reference, no `CiliumEndpoint` or slice naming it), and
 * a master whose twin names another key is never one (drift, the doctor's business). Cilium's two
 * GCs ignore each other's store, so its kvstore GC deletes the master of an identity a
 * `CiliumEndpoint` still names; this one does not.
 *
 * A candidate's version is both sides' versions, so a change on either side between two passes
 * re-marks it. The delete is the kvstore's guarded delete, then the twin's guarded delete (its
 * listed resource version): each side refuses what changed since the listing.
 *
 * @module
 */
import type { BackendSession, GcCandidate, GcListOptions } from "../../allocator/backend.ts";
import { idallocLogger } from "../../log.ts";

const log = idallocLogger("doublewrite");

/** Both sides' versions of one candidate, as its opaque version. */
interface Versions {
  readonly kvstore: string;
  /** The CRD twin's version, when the twin exists with the same key. */
  readonly crd?: string;
}

function encode(v: Versions): string {
  return JSON.stringify(v.crd === undefined ? [v.kvstore] : [v.kvstore, v.crd]);
}

function decode(version: string): Versions | undefined {
  try {
    const parsed: unknown = JSON.parse(version);
    if (!Array.isArray(parsed) || !parsed.every((p) => typeof p === "string")) return undefined;
    if (parsed.length === 1) return { kvstore: parsed[0] };
    if (parsed.length === 2) return { kvstore: parsed[0], crd: parsed[1] };
  } catch {
    // not ours: refused below
  }
  return undefined;
}

/**
 * The kvstore's masters in `range`, each in use when the kvstore uses it or its CRD twin is in
 * use (or names another key). The CRD side is listed first, in full, so a CRD that cannot be read
 * ends the pass instead of making its twins look unused.
 */
export async function* listBoth(
  kvstore: BackendSession,
  crd: BackendSession,
  range: { min: number; max: number },
  signal: AbortSignal,
  options?: GcListOptions,
): AsyncIterable<GcCandidate> {
  const twins = new Map<number, GcCandidate>();
  for await (const c of crd.gcList(range, signal, options)) twins.set(c.id, c);
  for await (const c of kvstore.gcList(range, signal, options)) {
    const twin = twins.get(c.id);
    const sameKey = twin !== undefined && twin.key === c.key;
    yield {
      id: c.id,
      key: c.key,
      version: encode({ kvstore: c.version, ...(sameKey ? { crd: twin.version } : {}) }),
      inUse: c.inUse || (twin !== undefined && (!sameKey || twin.inUse)),
    };
  }
}

/**
 * Deletes the kvstore master of `candidate` under the kvstore's guard, then its CRD twin under
 * the version it was listed at (Cilium's `DeleteID` deletes both). Returns whether the master
 * went; a twin that changed since stays (a later pass, or Cilium's CRD GC, judges it again).
 */
export async function deleteBoth(
  kvstore: BackendSession,
  crd: BackendSession,
  candidate: GcCandidate,
  signal: AbortSignal,
): Promise<boolean> {
  const versions = decode(candidate.version);
  if (versions === undefined || candidate.inUse) return false;
  const { id, key } = candidate;
  if (!await kvstore.gcDelete({ id, key, version: versions.kvstore, inUse: false }, signal)) {
    return false;
  }
  if (versions.crd === undefined) return true;
  try {
    const twin = { id, key, version: versions.crd, inUse: false };
    if (!await crd.gcDelete(twin, signal)) {
      log.info("CRD twin of collected ID {id} changed since listed; left for a later pass", { id });
    }
  } catch (err) {
    log.warning("could not delete the CRD twin of collected ID {id}: {err}", { id, err });
  }
  return true;
}
