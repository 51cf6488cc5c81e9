/**
 * GC of a double-write store, on the kvstore side as in Cilium (`RunGC` is the kvstore
 * backend's), with the CRD side's verdict added: a kvstore master is a candidate only when its
 * CRD twin is unused too (no live idalloc reference, no `CiliumEndpoint` or slice naming it), and
 * a master whose twin names another key is never one (drift, the doctor's business). Cilium's two
 * GCs ignore each other's store, so its kvstore GC deletes the master of an identity a
 * `CiliumEndpoint` still names; this one does not.
 *
 * Identities on the CRD side alone are candidates too, judged by the CRD side (Cilium's operator
 * runs its CRD GC beside the kvstore's in these modes): a twin whose delete was refused after its
 * master went would otherwise stay forever.
 *
 * A candidate's version is both sides' versions, so a change on either side between two passes
 * re-marks it. The delete is the kvstore's guarded delete, then the twin's guarded delete (its
 * listed resource version, and its mark when it was listed marked, which spares the CRD side a
 * mark of its own): each side refuses what changed since the listing.
 *
 * @module
 */
import type { BackendSession, GcCandidate, GcListOptions } from "../../allocator/backend.ts";
import { idallocLogger } from "../../log.ts";

const log = idallocLogger("doublewrite");

/** Both sides' versions of one candidate (at least one side), as its opaque version. */
interface Versions {
  /** The kvstore master's version; absent for an identity on the CRD side only. */
  readonly kvstore?: string;
  /** The CRD identity's version, when it exists with the candidate's key. */
  readonly crd?: string;
  /** When the CRD identity was marked unused, if it was marked when listed. */
  readonly crdMarkedAt?: number;
}

function encode(v: Versions): string {
  return JSON.stringify(v);
}

function decode(version: string): Versions | undefined {
  try {
    const parsed: unknown = JSON.parse(version);
    if (typeof parsed !== "object" || parsed === null) return undefined;
    const { kvstore, crd, crdMarkedAt } = parsed as Record<string, unknown>;
    const optional = (v: unknown, type: string) => v === undefined || typeof v === type;
    if (!optional(kvstore, "string") || !optional(crd, "string")) return undefined;
    if (!optional(crdMarkedAt, "number") || (kvstore === undefined && crd === undefined)) {
      return undefined;
    }
    return parsed as Versions;
  } catch {
    // not ours: refused below
  }
  return undefined;
}

/** The CRD identity's part of a candidate's versions. */
function crdPart(c: GcCandidate): Versions {
  return { crd: c.version, ...(c.markedAt === undefined ? {} : { crdMarkedAt: c.markedAt }) };
}

/**
 * The kvstore's masters in `range`, each in use when the kvstore uses it or its CRD twin is in
 * use (or names another key), then the identities on the CRD side alone, as the CRD side judges
 * them: a twin whose delete was refused after its master went (a mark, a join changed it), a
 * CRD-mode node's identity never copied. Cilium's operator runs both GCs in the double-write
 * modes; without the second part such identities would stay forever. The CRD side is listed
 * first, in full, so a CRD that cannot be read ends the pass instead of making its twins look
 * unused.
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
    twins.delete(c.id);
    const sameKey = twin !== undefined && twin.key === c.key;
    yield {
      id: c.id,
      key: c.key,
      version: encode({ kvstore: c.version, ...(sameKey ? crdPart(twin) : {}) }),
      inUse: c.inUse || (twin !== undefined && (!sameKey || twin.inUse)),
    };
  }
  for (const twin of twins.values()) {
    yield { id: twin.id, key: twin.key, version: encode(crdPart(twin)), inUse: twin.inUse };
  }
}

/**
 * Deletes the kvstore master of `candidate` under the kvstore's guard, then its CRD identity under
 * the version it was listed at (Cilium's `DeleteID` deletes both); an identity on the CRD side
 * alone, under the CRD side's guard only. Returns whether what the kvstore held went (for a
 * CRD-only candidate: the CRD identity); a twin that changed since stays, on the CRD side alone,
 * where a later pass judges it again.
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
  const twin: GcCandidate | undefined = versions.crd === undefined ? undefined : {
    id,
    key,
    version: versions.crd,
    inUse: false,
    ...(versions.crdMarkedAt === undefined ? {} : { markedAt: versions.crdMarkedAt }),
  };
  if (versions.kvstore === undefined) return twin !== undefined && crd.gcDelete(twin, signal);
  if (!await kvstore.gcDelete({ id, key, version: versions.kvstore, inUse: false }, signal)) {
    return false;
  }
  if (twin === undefined) return true;
  try {
    if (!await crd.gcDelete(twin, signal)) {
      log.info("CRD twin of collected ID {id} changed since listed; left for a later pass", { id });
    }
  } catch (err) {
    log.warning("could not delete the CRD twin of collected ID {id}: {err}", { id, err });
  }
  return true;
}
