/**
 * Garbage collection of unused IDs by two-round marking (Cilium's `RunGC`): an ID is deleted only
 * when a pass finds it unused with the same version that the previous pass marked. The version
 * changes whenever any node acquires a reference, so an ID re-acquired between passes is never
 * collected; the backend's guarded delete covers acquisitions during the final pass itself.
 *
 * A backend with `gcMark` (Kubernetes) keeps the marks **in the store**, where every acquirer
 * removes them (Cilium's `io.cilium.heartbeat`): a first unused sighting writes the mark under the
 * listed version, and the delete is guarded by the version the mark left. A master found marked
 * by someone else (another process's pass, Cilium's operator) counts its grace from the mark's
 * time (`GcCandidate.markedAt`), so a later process continues where an earlier one stopped.
 *
 * @module
 */
import type { BackendSession, GcCandidate } from "./backend.ts";
import { sleep } from "../abort.ts";
import type { GcStats } from "./types.ts";
import { idallocLogger } from "../log.ts";

const log = idallocLogger("gc");

/** Limits deletions to `burst` per `intervalMs` window. */
export class RateLimiter {
  readonly #intervalMs: number;
  readonly #burst: number;
  #windowStart = 0;
  #used = 0;

  /** @param intervalMs window length; @param burst events per window */
  constructor(intervalMs: number, burst: number) {
    this.#intervalMs = intervalMs;
    this.#burst = burst;
  }

  /** Waits until one more event is allowed. */
  async take(signal?: AbortSignal): Promise<void> {
    const now = Date.now();
    if (now - this.#windowStart >= this.#intervalMs) {
      this.#windowStart = now;
      this.#used = 0;
    }
    if (this.#used >= this.#burst) {
      await sleep(this.#windowStart + this.#intervalMs - now, signal);
      this.#windowStart = Date.now();
      this.#used = 0;
    }
    this.#used++;
  }
}

/** An ID a pass found unused. */
interface Mark {
  readonly version: string;
  /** When a pass first found it unused with this version (ms since the epoch). */
  readonly since: number;
}

/** Runs GC passes over one ID range, remembering the marks between passes. */
export class GarbageCollector {
  readonly #session: BackendSession;
  readonly #range: { min: number; max: number };
  readonly #limiter: RateLimiter;
  readonly #graceMs: number;
  /** IDs the previous pass found unused: their version then, and when they were first seen so. */
  #marked = new Map<number, Mark>();

  /**
   * @param session the store session
   * @param range stored IDs to consider (other clusters' IDs are never touched)
   * @param limiter the deletion rate limit
   * @param graceMs how long an ID must have been seen unused, unchanged, before it is deleted
   */
  constructor(
    session: BackendSession,
    range: { min: number; max: number },
    limiter: RateLimiter,
    graceMs = 0,
  ) {
    this.#session = session;
    this.#range = range;
    this.#limiter = limiter;
    this.#graceMs = graceMs;
  }

  /** One pass: deletes IDs marked by the previous pass and still unused and unchanged, marks the rest. */
  async run(signal: AbortSignal): Promise<GcStats> {
    const next = new Map<number, Mark>();
    const deletedIds: number[] = [];
    let total = 0;
    let skipped = 0;
    const onSkip = () => void skipped++;
    for await (const candidate of this.#session.gcList(this.#range, signal, { onSkip })) {
      total++;
      if (candidate.inUse) continue;
      const previous = this.#marked.get(candidate.id);
      if (this.#session.gcMark !== undefined) {
        const verdict = await this.#storeMark(candidate, previous, signal);
        if (verdict === "delete") {
          if (await this.#delete(candidate, signal)) deletedIds.push(candidate.id);
        } else if (verdict !== undefined) next.set(candidate.id, verdict);
        continue;
      }
      // Unseen, or changed since (re-acquired and released): marked now, a later pass decides.
      if (previous === undefined || previous.version !== candidate.version) {
        next.set(candidate.id, { version: candidate.version, since: Date.now() });
        continue;
      }
      // A reference can vanish without its holder knowing (a revoked lease): the holder answers
      // from memory until its own lease deadline. Within the grace it is still fencing itself,
      // and its ID must not go to another key yet.
      if (Date.now() - previous.since < this.#graceMs) {
        next.set(candidate.id, previous);
        continue;
      }
      if (await this.#delete(candidate, signal)) deletedIds.push(candidate.id);
    }
    this.#marked = next;
    if (skipped > 0) {
      // Each entry was logged where it was found; one line says what to do about them.
      log.warning("GC pass skipped {skipped} damaged entries; `idalloc doctor` lists them", {
        skipped,
      });
    }
    return {
      alive: total - deletedIds.length,
      deleted: deletedIds.length,
      marked: next.size,
      deletedIds,
      skipped,
    };
  }

  /** The guarded delete, rate-limited. */
  async #delete(candidate: GcCandidate, signal: AbortSignal): Promise<boolean> {
    await this.#limiter.take(signal);
    if (!await this.#session.gcDelete(candidate, signal)) return false;
    log.info("collected unused ID {id} of key {key}", { id: candidate.id, key: candidate.key });
    return true;
  }

  /**
   * An unused candidate of a backend that marks in the store: the mark to remember, `delete` when
   * its grace has passed, or `undefined` when it changed under the mark being written (a later
   * pass looks again). Unmarked in the store (never marked, or a use removed the mark since):
   * marked now. Marked: its grace counts from this process's sighting of this very version, else
   * from the mark's own time.
   */
  async #storeMark(
    candidate: GcCandidate,
    previous: Mark | undefined,
    signal: AbortSignal,
  ): Promise<Mark | "delete" | undefined> {
    if (candidate.markedAt === undefined) {
      const version = await this.#session.gcMark!(candidate, signal);
      return version === undefined ? undefined : { version, since: Date.now() };
    }
    const since = previous?.version === candidate.version ? previous.since : candidate.markedAt;
    if (Date.now() - since < this.#graceMs) return { version: candidate.version, since };
    return "delete";
  }
}
