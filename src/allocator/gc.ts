/**
 * Garbage collection of unused IDs by two-round marking (Cilium's `RunGC`): an ID is deleted only
 * when a pass finds it unused with the same version that the previous pass marked. The version
 * changes whenever any node acquires a reference, so an ID re-acquired between passes is never
 * collected; the backend's guarded delete covers acquisitions during the final pass itself.
 *
 * @module
 */
import type { BackendSession } from "./backend.ts";
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

/** Runs GC passes over one ID range, remembering the marks between passes. */
export class GarbageCollector {
  readonly #session: BackendSession;
  readonly #range: { min: number; max: number };
  readonly #limiter: RateLimiter;
  #marked = new Map<number, string>();

  /**
   * @param session the store session
   * @param range stored IDs to consider (other clusters' IDs are never touched)
   * @param limiter the deletion rate limit
   */
  constructor(session: BackendSession, range: { min: number; max: number }, limiter: RateLimiter) {
    this.#session = session;
    this.#range = range;
    this.#limiter = limiter;
  }

  /** One pass: deletes IDs marked by the previous pass and still unused and unchanged, marks the rest. */
  async run(signal: AbortSignal): Promise<GcStats> {
    const next = new Map<number, string>();
    const deletedIds: number[] = [];
    let total = 0;
    let skipped = 0;
    const onSkip = () => void skipped++;
    for await (const candidate of this.#session.gcList(this.#range, signal, { onSkip })) {
      total++;
      if (candidate.inUse) continue;
      const previous = this.#marked.get(candidate.id);
      if (previous === undefined) {
        next.set(candidate.id, candidate.version);
        continue;
      }
      // Marked before but changed since (re-acquired and released): mark again, a third pass decides.
      if (previous !== candidate.version) {
        next.set(candidate.id, candidate.version);
        continue;
      }
      await this.#limiter.take(signal);
      if (await this.#session.gcDelete(candidate, signal)) {
        deletedIds.push(candidate.id);
        log.info("collected unused ID {id} of key {key}", { id: candidate.id, key: candidate.key });
      }
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
}
