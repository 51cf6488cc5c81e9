/**
 * Public types of the allocator: key codecs, options, results and events.
 *
 * @module
 */

/**
 * Turns keys of type `K` into the strings the store holds and back. `encode` must be injective and
 * `decode(encode(k))` must equal `k`. The encoded string must not be empty.
 */
export interface KeyCodec<K> {
  /** The store's string for `key`. */
  encode(key: K): string;
  /** The key for a string read from the store; throws if the string is not a valid key. */
  decode(encoded: string): K;
}

/** The identity codec: keys are their own encoding. */
export const stringCodec: KeyCodec<string> = {
  encode: (key: string): string => key,
  decode: (encoded: string): string => encoded,
};

/** Retry policy of `allocate`: exponential backoff with full jitter, capped, bounded attempts. */
export interface BackoffOptions {
  /** First wait in ms. @default {20} */
  readonly initialMs?: number;
  /** Upper bound of one wait in ms. @default {2000} */
  readonly maxMs?: number;
  /** Growth factor per attempt. @default {2} */
  readonly factor?: number;
}

/** Rate limit of GC deletions: at most `burst` deletions per `intervalMs`. */
export interface GcRateLimit {
  /** Window length in ms. @default {60000} */
  readonly intervalMs?: number;
  /** Deletions allowed per window. @default {2500} */
  readonly burst?: number;
}

/** A rejected mapping: the returned string says why (logged); `undefined` accepts it. */
export type CacheValidator = (
  event: { readonly type: "upsert" | "delete"; readonly id: number; readonly key?: string },
) => string | undefined;

/** Options of {@linkcode Allocator.open}. */
export interface AllocatorOptions<K = string> {
  /** Lowest ID handed out (before the prefix mask). @default {1} */
  readonly min?: number;
  /** Highest ID handed out (before the prefix mask). Required: an unbounded range is refused. */
  readonly max: number;
  /** ORed into every newly selected ID (Cilium's `WithPrefixMask`). @default {0} */
  readonly prefixMask?: number;
  /** Key codec. Strings by default. */
  readonly codec?: KeyCodec<K>;
  /**
   * Re-create a master deleted while this node still holds its ID; consumers then see no delete.
   * @default {true}
   */
  readonly masterKeyProtection?: boolean;
  /** Lifetime of this node's lease in ms (a dead node's references lapse after it). @default {60000} */
  readonly leaseTtlMs?: number;
  /** Period of the local-key sync that re-creates vanished references and masters. @default {60000} */
  readonly syncIntervalMs?: number;
  /** Attempts per `allocate` before {@linkcode AllocationFailedError}. @default {16} */
  readonly maxAttempts?: number;
  /** Backoff between attempts. */
  readonly backoff?: BackoffOptions;
  /**
   * How long one `allocate` waits in all, in ms, while another writer holds a lock on the key or
   * its ID (a Cilium node's etcd mutex: it is between the steps of its own allocation or GC).
   * These waits do not count as attempts. Cilium's own lock wait is one minute, and a dead
   * holder's mutex lapses with its 25 s lock lease. The call's `signal` may end it sooner.
   * @default {60000}
   */
  readonly lockWaitMs?: number;
  /** Run a GC pass every this many ms (two passes collect an ID). Off when unset. */
  readonly gcIntervalMs?: number;
  /**
   * How long, in ms, an ID must have been seen unused (same version, no live reference) before GC
   * deletes it, on top of the two passes. A holder whose reference vanished without its knowing
   * (its lease was revoked) keeps answering from memory until its own lease deadline, at most one
   * lease TTL: the grace lets it notice and fence itself before its ID can go to another key. Set
   * it to at least the longest `leaseTtlMs` of any node. With passes at least a lease TTL apart
   * it costs nothing (the time counts from the pass that first found the ID unused); explicit
   * `runGc()` calls get it too, so a loop faster than the lease is as safe as `gcIntervalMs`. Set 0
   * where two back-to-back passes must collect at once (a test, a drain). On Kubernetes the grace also
   * keeps an identity created or marked less than that long ago, as Cilium's operator does.
   * @default {leaseTtlMs; on a store with its own default, the larger of the two (Kubernetes:
   * Cilium operator's heartbeat timeout, 30 min)}
   */
  readonly gcGraceMs?: number;
  /** Rate limit for GC deletions. */
  readonly gcRateLimit?: GcRateLimit;
  /** Drops cache events this returns a reason for (Cilium's cache validators). */
  readonly validator?: CacheValidator;
  /** Open without a lease: only lookups and watches; `allocate`/`release` throw. @default {false} */
  readonly readOnly?: boolean;
  /**
   * This process is the backend's node restarting: take over its lease record even though it is
   * still live (the previous process of this node is gone, its lease has not lapsed yet). Without
   * it, opening under a node name whose lease is live (another process, or another allocator of
   * this one, is that node) throws {@linkcode NodeInUseError}: two sessions under one name would
   * cut each other's references, and GC could give a running node's IDs to other keys. Never pass
   * it for a name another running process uses. Ignored with `readOnly`. @default {false}
   */
  readonly restart?: boolean;
  /**
   * Write-behind release: a key's last `release` returns once this node's bookkeeping is done and
   * the reference's deletion lands in the background (concurrent ones share a request). Acquiring
   * the key again first cancels a deletion not yet sent, or waits for one in flight;
   * {@linkcode Allocator.flush} waits for all of them; `close()` lets them land first. Until one
   * lands, the reference keeps the ID from GC. @default {false}
   */
  readonly releaseInBackground?: boolean;
}

/** Options that every async call accepts. */
export interface CallOptions {
  /** Aborts the call; it then rejects with `signal.reason`. */
  readonly signal?: AbortSignal;
}

/** The result of `allocate`. */
export interface AllocateResult {
  /** The key's ID, the same on every node. */
  readonly id: number;
  /** True when this call created the ID's master in the store. */
  readonly isNew: boolean;
  /** True when this call took this node's first local reference to the key. */
  readonly firstUse: boolean;
}

/** The result of `release`. */
export interface ReleaseResult {
  /** True when this was the last local use and the node's reference was removed from the store. */
  readonly lastUse: boolean;
}

/** One event of `watch()`. */
export type AllocatorEvent<K = string> =
  | {
    /** A mapping appeared or changed. */
    readonly type: "upsert";
    /** The ID. */
    readonly id: number;
    /** Its key. */
    readonly key: K;
  }
  | {
    /** A mapping is gone. */
    readonly type: "delete";
    /** The ID. */
    readonly id: number;
    /** The key it had. */
    readonly key: K;
  }
  | {
    /**
     * A key this node holds lost its ID while the node could not prove its claim (its lease lapsed
     * or was replaced, or the store gave the ID to another key), and was re-acquired under a new
     * ID. Every local use of the key now has `newId`; `oldId` must no longer be used for it.
     */
    readonly type: "reassigned";
    /** The key. */
    readonly key: K;
    /** The ID the key had here before. */
    readonly oldId: number;
    /** The ID the key has now, the same on every node. */
    readonly newId: number;
  }
  | {
    /** The replay of the cache is complete; live changes follow. */
    readonly type: "synced";
  };

/** What a GC pass did. */
export interface GcStats {
  /** Masters in range that remain. */
  readonly alive: number;
  /** Masters deleted by this pass. */
  readonly deleted: number;
  /** Masters found unused for the first time (deleted next pass if still unused and unchanged). */
  readonly marked: number;
  /** IDs deleted by this pass. */
  readonly deletedIds: readonly number[];
  /**
   * Damaged entries the pass skipped (an undecodable or oversized master, an unreadable
   * reference): logged, never collected. An operator removes them (`idalloc doctor`).
   */
  readonly skipped: number;
}
