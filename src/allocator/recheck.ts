/**
 * The re-check of held keys: everything that keeps this node's answers from memory true to the
 * store.
 *
 * - **The claim.** Held keys are answered from memory only while the session's claim
 *   (`claimValidUntil`) runs and the fence is down. A timer fires when the claim runs out, and
 *   every answer reads the clock too; a lapse raises the fence over every held key.
 * - **Conflicts.** The feed reports a held key whose ID the store shows under another key (or the
 *   key under another ID); that key alone is fenced.
 * - **Resolution.** While the fence is up, sync passes run (with backoff) until it is down: each
 *   proves held keys with the session's `ensure`, or moves a key whose ID was taken to the ID the
 *   store gives it now (announced as `reassigned`).
 * - **The sync.** Every `syncIntervalMs` (and on request) the same pass re-creates vanished
 *   references and masters of held keys, and has the deletions owner (`deletions.ts`) retry
 *   reference deletions that failed.
 * - **Master-key protection.** A deleted master of a held ID is re-created, unless another master
 *   names the key.
 *
 * @module
 */
import { abortable, sleep } from "../abort.ts";
import type { BackendSession, HeldKey } from "./backend.ts";
import { type Backoff, backoffDelay } from "./backoff.ts";
import type { IdCache } from "./cache.ts";
import type { CacheFeed } from "./cache_feed.ts";
import type { ReferenceDeletions } from "./deletions.ts";
import type { Fence } from "./fence.ts";
import type { KeyedMutex } from "./keyed_mutex.ts";
import type { LocalKeys } from "./local_keys.ts";
import type { Acquirer } from "./acquire.ts";
import type { KeyCodec } from "./types.ts";
import { idallocLogger } from "../log.ts";
import type { TaskGroup } from "../task_group.ts";
import type { AllocatorTelemetry } from "../telemetry/allocator.ts";

const log = idallocLogger("allocator");

/** Held keys re-checked per `ensure` call of the sync. */
const SYNC_BATCH = 32;
/** Cap of the linear retry delay when re-creating a protected master key. */
const PROTECT_MAX_DELAY_MS = 10_000;
/**
 * How long a held key stays fenced after a re-check found a newer master of it that no reference
 * names yet (Cilium's `UpdateKey` writes a master, then its reference, without a mutex). Past it
 * the key keeps the ID its references agree on; the periodic sync still moves it once the newer
 * master is referenced (a split, judged by the store's rule).
 */
const NEWER_MASTER_WAIT_MS = 5_000;

/** The session calls the re-check makes. */
export type RecheckSession = Pick<
  BackendSession,
  "ensure" | "release" | "renew" | "claimValidUntil" | "getById" | "newerVersion"
>;

/** What {@linkcode Recheck} works with. */
export interface RecheckParts<K> {
  readonly session: RecheckSession;
  readonly fence: Fence;
  readonly local: LocalKeys;
  readonly mutex: KeyedMutex;
  readonly cache: Pick<IdCache<K>, "otherIds" | "entry">;
  readonly feed: Pick<CacheFeed<K>, "insertLocal" | "forget" | "announce">;
  readonly acquirer: Pick<Acquirer<K>, "acquire">;
  readonly deletions: Pick<ReferenceDeletions, "retry">;
  readonly codec: KeyCodec<K>;
  /** The tasks the re-check spawns stop with this group. */
  readonly tasks: TaskGroup;
  readonly telemetry: Pick<AllocatorTelemetry, "sync">;
  /** The node's name, for messages. */
  readonly node: string;
  readonly backoff: Backoff;
  readonly masterKeyProtection: boolean;
  readonly readOnly: boolean;
}

/** The re-check of one allocator's held keys (see the module doc). */
export class Recheck<K> {
  readonly #p: RecheckParts<K>;
  /** IDs whose master is being re-created by master-key protection. */
  readonly #protecting = new Set<number>();
  /** Held keys waiting for a newer master's reference: since when (see `#awaitsNewerMaster`). */
  readonly #awaitingNewer = new Map<string, number>();
  /** Fires when the session's claim runs out, unless a renewal pushed it further. */
  #claimTimer: ReturnType<typeof setTimeout> | undefined;
  /** A loop re-checking held keys until the fence is down is running. */
  #resolving = false;
  #syncRunning: Promise<void> | undefined;
  #syncAgain = false;

  /** A re-check over `parts`; nothing runs until {@linkcode Recheck.start}. */
  constructor(parts: RecheckParts<K>) {
    this.#p = parts;
  }

  /** Arms the claim timer. */
  start(): void {
    this.#armClaimTimer();
  }

  /** Stops the claim timer (the task group stops the rest). */
  stop(): void {
    clearTimeout(this.#claimTimer);
    this.#claimTimer = undefined;
  }

  /**
   * Whether held keys may be answered from memory: the fence is down and the claim has not run
   * out. The clock is read on every answer, not left to the claim timer alone: when a stopped
   * process resumes, a caller's timer that was due earlier runs before ours. A lapse found here
   * raises the fence at once.
   */
  answersFromMemory(): boolean {
    if (Date.now() >= this.#p.session.claimValidUntil()) {
      this.#lapsed();
      return false;
    }
    return !this.#p.fence.active;
  }

  /** The session's lease was replaced: every reference of the old lease is gone. */
  leaseReplaced(): void {
    if (this.#p.tasks.closed) return;
    // Nothing held may be answered until re-checked.
    this.#p.fence.raiseAll("lease replaced");
    log.warning("lease replaced: re-checking {n} held keys before answering them", {
      n: this.#p.local.size,
    });
    this.#resolveFence();
  }

  /** The store shows held `key`'s ID under another key, or the key under another ID. */
  conflict(key: string, why: string): void {
    if (this.#p.tasks.closed || this.#p.fence.isSuspect(key)) return;
    this.#p.fence.raise(key);
    log.warning("held key {key} conflicts with the store ({why}): re-checking it", { key, why });
    this.#resolveFence();
  }

  /**
   * The master of `id`, held here for `key`, was deleted. With master-key protection (and a
   * writable allocator) it is re-created and the ID kept: returns true, and the feed shows
   * consumers no delete.
   */
  deletedHeld(key: string, id: number): boolean {
    if (!this.#p.masterKeyProtection || this.#p.readOnly) return false;
    this.#protect(key, id);
    return true;
  }

  /** `key` is held again: a wait for a newer master of an earlier hold does not carry over. */
  heldAgain(key: string): void {
    this.#awaitingNewer.delete(key);
  }

  /**
   * Runs a sync pass (or, if one runs, one more after it) and waits for it, bounded by `signal`.
   * `reason` is `periodic`, `requested` or `fence`.
   */
  requestSync(reason = "periodic", signal?: AbortSignal): Promise<void> {
    if (this.#syncRunning) {
      this.#syncAgain = true;
      return abortable(this.#syncRunning, signal);
    }
    const { tasks, telemetry, local } = this.#p;
    const run = (async () => {
      do {
        this.#syncAgain = false;
        try {
          await telemetry.sync(reason, local.size, () => this.#syncHeld(reason));
        } catch (err) {
          if (!tasks.closed) log.warning("key sync failed: {err}", { err });
        }
      } while (this.#syncAgain && !tasks.closed);
    })().finally(() => (this.#syncRunning = undefined));
    this.#syncRunning = run;
    this.#spawn(run);
    return abortable(run, signal);
  }

  #spawn(task: Promise<unknown>): void {
    this.#p.tasks.spawn(task, (err) => log.error("background task failed: {err}", { err }));
  }

  /**
   * Arms a timer for the moment the session's claim runs out, so that a node whose lease could
   * not be renewed starts re-checking its keys at once, even when nobody asks it anything.
   */
  #armClaimTimer(): void {
    this.stop();
    const until = this.#p.session.claimValidUntil();
    if (this.#p.tasks.closed || this.#resolving || !Number.isFinite(until)) return;
    const delay = Math.min(Math.max(0, until - Date.now()), 2 ** 31 - 1);
    this.#claimTimer = setTimeout(() => {
      this.#claimTimer = undefined;
      if (Date.now() >= this.#p.session.claimValidUntil()) this.#lapsed();
      else this.#armClaimTimer();
    }, delay);
  }

  /**
   * The claim ran out before the lease could be renewed (a stall, an unreachable store). Raised
   * again each time it is seen while it lasts, so that keys a running re-check verified before the
   * lapse are not answered: only a re-check that starts after the claim is valid again clears it.
   */
  #lapsed(): void {
    if (this.#p.tasks.closed) return;
    if (this.#p.fence.raiseAll("lease lapsed")) {
      log.warning("lease of {node} lapsed before renewal: fencing {n} held keys until re-checked", {
        node: this.#p.node,
        n: this.#p.local.size,
      });
    }
    this.#resolveFence();
  }

  /** Re-checks held keys (re-acquiring those whose ID was taken) until the fence is down. */
  #resolveFence(): void {
    const { tasks, fence, backoff } = this.#p;
    if (this.#resolving || this.#p.readOnly || tasks.closed) return;
    this.#resolving = true;
    this.stop();
    const signal = tasks.signal;
    this.#spawn((async () => {
      try {
        for (let attempt = 0; fence.active && !signal.aborted; attempt++) {
          if (attempt > 0) await sleep(backoffDelay(backoff, attempt - 1), signal);
          await this.requestSync("fence");
        }
      } finally {
        this.#resolving = false;
        this.#armClaimTimer();
      }
    })());
  }

  #protect(key: string, id: number): void {
    if (this.#protecting.has(id)) return;
    this.#protecting.add(id);
    const { tasks, mutex, local, session } = this.#p;
    const signal = tasks.signal;
    this.#spawn((async () => {
      try {
        for (let attempt = 1; !signal.aborted; attempt++) {
          try {
            using _lock = await mutex.lock(key, signal);
            if (local.get(key)?.id !== id) return; // released meanwhile: nothing to protect
            // Protection re-creates a master only for a key with no other ID: one that meanwhile
            // got another master moves to the ID the store gives it.
            if (this.#secondMaster({ key, id })) {
              this.conflict(key, `it has another master; ID ${id} is not re-created`);
              return;
            }
            const [report] = await session.ensure([{ key, id }], signal);
            if (report.master === "conflict") {
              // Someone else has the ID or the key now: the key moves to a new ID.
              this.conflict(key, `master of ID ${id} cannot be re-created`);
              return;
            }
            if (report.master !== "busy") {
              log.warning("re-created deleted master key of ID {id} ({key}), still in use here", {
                id,
                key,
              });
              return;
            }
          } catch (err) {
            if (signal.aborted) return;
            log.warning("re-creating master of ID {id} failed: {err}", { id, err });
          }
          await sleep(Math.min(attempt * 1_000, PROTECT_MAX_DELAY_MS), signal);
        }
      } finally {
        this.#protecting.delete(id);
      }
    })());
  }

  async #syncHeld(reason: string): Promise<void> {
    const { session, fence, local, mutex, tasks } = this.#p;
    const signal = tasks.signal;
    // A fenced node proves its lease first (renewing it, or replacing a lapsed one), so that what
    // this pass re-checks is held under a lease that is alive.
    if (fence.active) await session.renew(signal);
    const gen = fence.generation;
    // Only some keys in doubt (conflicts): re-check those; the lease itself is not in question.
    const onlySuspects = reason === "fence" && fence.active && !fence.status().all;
    let complete = true;
    await this.#p.deletions.retry();
    const held = local.snapshot()
      .filter(({ key }) => !onlySuspects || fence.isSuspect(key))
      .sort((a, b) => (a.key < b.key ? -1 : 1));
    for (let i = 0; i < held.length; i += SYNC_BATCH) {
      const batch = held.slice(i, i + SYNC_BATCH);
      // Locks in key order: one consistent order, so no deadlock with single-key holders.
      const locks: Disposable[] = [];
      try {
        for (const { key } of batch) locks.push(await mutex.lock(key, signal));
        complete = await this.#recheckBatch(batch, gen, reason, signal) && complete;
      } finally {
        for (const lock of locks) lock[Symbol.dispose]();
      }
    }
    if (complete && !onlySuspects && Date.now() < session.claimValidUntil()) {
      fence.passCompleted(gen);
    }
  }

  /** Re-checks `batch` (whose keys' locks the caller holds); returns whether all were proven. */
  async #recheckBatch(
    batch: readonly HeldKey[],
    gen: number,
    reason: string,
    signal: AbortSignal,
  ): Promise<boolean> {
    const { fence, local, session } = this.#p;
    let complete = true;
    // Re-check under the locks: a key released since the snapshot must not be re-created.
    const still: HeldKey[] = [];
    for (const held of batch) {
      if (local.get(held.key)?.id !== held.id) continue;
      // A suspect key is proven only if no other master names it: otherwise re-creating or
      // re-referencing this one could give the key a second ID, so it is re-acquired by the
      // store's own rule instead (and moves, announced, if that rule says so).
      if (fence.isSuspect(held.key) && this.#secondMaster(held)) {
        complete = await this.#reassign(held.key, held.id, gen, signal) && complete;
      } else still.push(held);
    }
    if (still.length === 0) return complete;
    for (const report of await session.ensure(still, signal)) {
      // A master that appeared for the key while `ensure` ran is checked again here: the key is
      // proven only if the store holds no other ID for it when the pass answers.
      if (
        report.master === "conflict" ||
        (fence.isSuspect(report.key) && this.#secondMaster(report))
      ) {
        complete = await this.#reassign(report.key, report.id, gen, signal) && complete;
        continue;
      }
      if (report.master === "busy") {
        complete = false;
        continue;
      }
      fence.verified(report.key, gen);
      if (report.master === "recreated" || report.reference === "recreated") {
        log.warning("re-created missing {what} of {key} (ID {id}) [{reason}]", {
          what: report.master === "recreated" ? "master and reference" : "reference",
          key: report.key,
          id: report.id,
          reason,
        });
      }
    }
    return complete;
  }

  /** Whether the cache knows a master other than `held.id` that names `held.key`. */
  #secondMaster(held: HeldKey): boolean {
    const others = this.#p.cache.otherIds(held.key, held.id);
    if (others.length === 0) return false;
    log.warning("held key {key} (ID {id}) also has master(s) {others}: re-acquiring it", {
      ...held,
      others,
    });
    return true;
  }

  /**
   * Moves held `key` off `oldId`, which the store shows belonging to something else, to the ID
   * the store gives it now (the caller holds the key's lock). Returns whether it succeeded; on
   * failure the key stays fenced and the next pass tries again.
   */
  async #reassign(key: string, oldId: number, gen: number, signal: AbortSignal): Promise<boolean> {
    const { fence, session, acquirer, local, feed, codec } = this.#p;
    // Suspect until re-acquired: nothing may answer the old ID meanwhile.
    const raisedAt = fence.raise(key);
    try {
      // Our own reference may still name the old ID; it must not hold the key there.
      await session.release(key, oldId, signal);
      // No waiting for another writer's lock here: this pass holds other keys' locks too; the key
      // stays fenced and the next pass tries again.
      const { id, version } = await acquirer.acquire(key, signal, 0);
      if (this.#awaitsNewerMaster(key, id, oldId, version)) {
        // Still fenced, and still held as `oldId` (so that a move is announced from it): the
        // fence's passes come back to it (from a periodic pass too).
        this.#resolveFence();
        return false;
      }
      local.rekey(key, id);
      fence.verified(key, Math.max(gen, raisedAt));
      if (id === oldId) return true;
      fence.reassigned();
      feed.insertLocal(key, id, version);
      await this.#forgetIfGone(oldId, key, signal);
      const value = codec.decode(key);
      log.warning("held key {key} lost ID {oldId} while fenced; re-acquired as {newId}", {
        key,
        oldId,
        newId: id,
      });
      feed.announce({ type: "reassigned", key: value, oldId, newId: id });
      return true;
    } catch (err) {
      if (!signal.aborted) log.error("re-acquiring {key} failed: {err}", { key, err });
      this.#resolveFence();
      return false;
    }
  }

  /**
   * Whether `key`, just re-acquired as `id` (held as `oldId`), should stay fenced a while longer:
   * the cache knows a master of the key newer than `id`'s, which Cilium's lookup
   * (`cache.OnUpsert`: the newest master wins) already answers, but no reference names it yet, so
   * the store's rule still gave `id`. The master of `oldId` itself does not count: this node just
   * left it. Bounded by {@linkcode NEWER_MASTER_WAIT_MS}. Never on a store whose versions have
   * no order (`BackendSession.newerVersion` absent).
   */
  #awaitsNewerMaster(
    key: string,
    id: number,
    oldId: number,
    version: string | undefined,
  ): boolean {
    const { cache, session } = this.#p;
    if (session.newerVersion === undefined) return false;
    const mine = version ?? cache.entry(id)?.version;
    const newer = cache.otherIds(key, id).some((other) => {
      if (other === oldId) return false;
      const v = cache.entry(other)?.version;
      return v !== undefined && (mine === undefined || session.newerVersion!(v, mine));
    });
    const since = this.#awaitingNewer.get(key);
    if (!newer || (since !== undefined && Date.now() - since >= NEWER_MASTER_WAIT_MS)) {
      this.#awaitingNewer.delete(key);
      return false;
    }
    if (since === undefined) {
      this.#awaitingNewer.set(key, Date.now());
      log.warning("held key {key}: a newer master than ID {id} has no reference yet; waiting", {
        key,
        id,
      });
    }
    return true;
  }

  /**
   * After `key` left `oldId`: a master deletion that protection kept from the cache is applied
   * now if the store has no master for `oldId` any more (when another key has it, the watch
   * reports that).
   */
  async #forgetIfGone(oldId: number, key: string, signal: AbortSignal): Promise<void> {
    if (this.#p.cache.entry(oldId)?.key !== key) return;
    if (await this.#p.session.getById(oldId, signal) !== undefined) return;
    this.#p.feed.forget(oldId);
  }
}
