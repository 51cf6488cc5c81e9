/**
 * Acquiring a key in the store, with the allocator's retry and lock-wait policy.
 *
 * Retryable failures (`IdallocError.retryable`) are retried with capped, jittered backoff, at
 * most `maxAttempts` times. Another writer's lock (`KeyLockedError`: a Cilium node between the
 * steps of its own allocation) is waited out for up to `lockWaitMs` in all, and those waits do not
 * count as attempts, as a Cilium node would wait for the mutex.
 *
 * @module
 */
import { sleep } from "../abort.ts";
import type { AcquireResult, AttemptTrail, BackendSession } from "./backend.ts";
import { type Backoff, backoffDelay } from "./backoff.ts";
import type { IdCache } from "./cache.ts";
import type { ReferenceDeletions } from "./deletions.ts";
import type { IdPool } from "./id_pool.ts";
import type { IdSpace } from "./id_space.ts";
import {
  AllocationFailedError,
  IdallocError,
  KeyLockedError,
  PoolExhaustedError,
} from "../errors.ts";
import { idallocLogger } from "../log.ts";

const log = idallocLogger("allocator");

/** How often and how long acquisition tries. */
export interface RetryPolicy {
  /** Attempts at most; waits for another writer's lock are not attempts. */
  readonly maxAttempts: number;
  /** The longest wait for other writers' locks in all, in ms (0: a held lock fails at once). */
  readonly lockWaitMs: number;
  /** The delay between attempts. */
  readonly backoff: Backoff;
}

/**
 * Runs `attempt` until it succeeds, under `policy` (see the module doc). `onRetry` hears each
 * failure that is tried again. Throws a non-retryable error at once, `signal.reason` when it
 * aborts, and {@linkcode AllocationFailedError} (for `key`) once the attempts are spent.
 */
export async function retrying<T>(
  policy: RetryPolicy,
  key: string,
  signal: AbortSignal,
  attempt: () => Promise<T>,
  onRetry: (err: unknown) => void = () => {},
): Promise<T> {
  let lastError: unknown;
  let lockWaitUntil: number | undefined;
  let waits = 0;
  for (let attempts = 0; attempts < policy.maxAttempts;) {
    if (attempts + waits > 0) {
      await sleep(backoffDelay(policy.backoff, attempts + waits - 1), signal);
    }
    signal.throwIfAborted();
    try {
      return await attempt();
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      if (!(err instanceof IdallocError && err.retryable)) throw err;
      lastError = err;
      if (err instanceof KeyLockedError) {
        if (policy.lockWaitMs === 0) throw err;
        lockWaitUntil ??= Date.now() + policy.lockWaitMs;
        if (Date.now() < lockWaitUntil) {
          waits = Math.min(waits + 1, 8);
          log.debug("key {key} is locked by another writer; waiting: {err}", { key, err });
          onRetry(err);
          continue;
        }
      }
      attempts++;
      log.debug("allocation attempt {attempt} for {key} failed: {err}", {
        attempt: attempts,
        key,
        err,
      });
      if (attempts < policy.maxAttempts) onRetry(err);
    }
  }
  throw new AllocationFailedError(key, policy.maxAttempts, { cause: lastError });
}

/** What {@linkcode Acquirer} works with. */
export interface AcquireParts<K> {
  readonly session: Pick<BackendSession, "acquire">;
  readonly cache: Pick<IdCache<K>, "lookup">;
  readonly pool: IdPool;
  readonly space: IdSpace;
  readonly policy: RetryPolicy;
  /** Records the acquired ID in the pool and the cache at once (the feed's `insertLocal`). */
  readonly record: (key: string, id: number, version: string | undefined) => void;
  /** Deletes what an aborted call may have written (see `ReferenceDeletions.abandoned`). */
  readonly deletions: Pick<ReferenceDeletions, "abandoned">;
  /** Hears each failure that is tried again (telemetry). */
  readonly onRetry: (err: unknown) => void;
}

/** Acquires keys in the store for one allocator (see the module doc). */
export class Acquirer<K> {
  readonly #p: AcquireParts<K>;

  /** An acquirer over `parts`. */
  constructor(parts: AcquireParts<K>) {
    this.#p = parts;
  }

  /**
   * Acquires `key` (the caller holds its lock) and records the ID in the pool and the cache; the
   * caller records the local hold. `lockWaitMs` overrides the policy's (0 for a caller that holds
   * other keys' locks and must not wait). The result is `created` when any attempt created the
   * master it names (an attempt may create it and fail after: see {@linkcode AttemptTrail}).
   */
  async acquire(
    key: string,
    signal: AbortSignal,
    lockWaitMs = this.#p.policy.lockWaitMs,
    roundTrips?: { count: number },
  ): Promise<AcquireResult> {
    const { space } = this.#p;
    const trail: AttemptTrail = {};
    try {
      const result = await retrying(
        { ...this.#p.policy, lockWaitMs },
        key,
        signal,
        () => this.#attempt(key, signal, trail, roundTrips),
        this.#p.onRetry,
      );
      return { ...result, created: result.created || trail.created === result.id };
    } catch (err) {
      // The session does not know the range; say it here.
      if (err instanceof AllocationFailedError && err.cause instanceof PoolExhaustedError) {
        throw new AllocationFailedError(key, this.#p.policy.maxAttempts, {
          cause: new PoolExhaustedError(space.min, space.max, { cause: err.cause }),
        });
      }
      throw err;
    }
  }

  async #attempt(
    key: string,
    signal: AbortSignal,
    trail: AttemptTrail,
    roundTrips?: { count: number },
  ): Promise<AcquireResult> {
    const { space, pool } = this.#p;
    const leased: number[] = [];
    try {
      const hint = this.#p.cache.lookup(key);
      // A master outside this allocator's range (another cluster's identity under the same
      // prefix) is never a hint: joining it would write a reference to an ID this node refuses.
      const inRange = hint !== undefined && space.contains(hint.id);
      const result = await this.#p.session.acquire({
        key,
        hint: inRange && hint.version !== undefined
          ? { id: hint.id, version: hint.version }
          : undefined,
        pickCandidate: (exclude) => {
          const unmasked = pool.lease(key, space.unmaskAll(exclude));
          if (unmasked === undefined) return undefined;
          leased.push(unmasked);
          return space.mask(unmasked);
        },
        range: space.stored,
        signal,
        roundTrips,
        trail,
      });
      const id = space.validId(result.id, key);
      this.#p.record(key, id, result.version);
      return { ...result, id };
    } catch (err) {
      // The write may have landed before the abort: make sure no reference outlives the call.
      if (signal.aborted) this.#p.deletions.abandoned(key);
      throw err;
    } finally {
      for (const id of leased) pool.release(id);
    }
  }
}
