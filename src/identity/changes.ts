/**
 * The batched change stream (Cilium's `identityWatcher`): producers record adds and deletes
 * synchronously and never wait; each subscriber folds them into one pending batch that it takes
 * whole when it is ready. An add followed by a delete of the same ID in one batch leaves only the
 * delete, and the other way round only the add, so `added` and `deleted` are always disjoint and a
 * slow subscriber's memory is bounded by the number of distinct IDs, not of events.
 *
 * @module
 */
import type { Labels } from "./labels.ts";
import type { IdentityChange } from "./types.ts";

class Subscription {
  added = new Map<number, Labels>();
  deleted = new Set<number>();
  ended = false;
  wake: (() => void) | undefined;

  get empty(): boolean {
    return this.added.size === 0 && this.deleted.size === 0;
  }

  add(id: number, labels: Labels): void {
    this.deleted.delete(id);
    this.added.set(id, labels);
    this.wake?.();
  }

  delete(id: number): void {
    this.added.delete(id);
    this.deleted.add(id);
    this.wake?.();
  }

  take(): IdentityChange {
    const batch = { added: this.added, deleted: this.deleted };
    this.added = new Map();
    this.deleted = new Set();
    return batch;
  }

  end(): void {
    this.ended = true;
    this.wake?.();
  }
}

/** Fans identity changes out to any number of batched subscribers. */
export class ChangeHub {
  readonly #subscriptions = new Set<Subscription>();
  /**
   * What was last announced per ID: a repeat of it is no change. The labels themselves, not
   * their text: the cache holds the same objects, so this costs no copy per identity.
   */
  readonly #announced = new Map<number, Labels>();
  #closed = false;

  /** Number of live subscribers. */
  get subscribers(): number {
    return this.#subscriptions.size;
  }

  /**
   * Records that `id` now maps to `labels`. Announcing the same mapping again is no change: a new
   * identity is announced when it is allocated and then echoed by the store's watch, and
   * subscribers must hear of it once.
   */
  add(id: number, labels: Labels): void {
    if (this.#announced.get(id)?.equals(labels)) return;
    this.#announced.set(id, labels);
    for (const sub of this.#subscriptions) sub.add(id, labels);
  }

  /** Records that `id` is gone. */
  delete(id: number): void {
    this.#announced.delete(id);
    for (const sub of this.#subscriptions) sub.delete(id);
  }

  /**
   * A stream of batches, subscribed at once (changes recorded before the first `next()` are kept).
   * `initial` (the current state) forms the first batch when non-empty. The stream ends at once
   * when `signal` aborts or the consumer breaks, and after the pending batch when the hub closes.
   *
   * A waiting consumer is woken by the first change but resumes only after the producer's current
   * synchronous work, so everything recorded in that burst lands in the same batch.
   */
  subscribe(
    initial: Iterable<readonly [number, Labels]>,
    signal?: AbortSignal,
  ): AsyncIterableIterator<IdentityChange> {
    const sub = new Subscription();
    const subscriptions = this.#subscriptions;
    const done = (): IteratorResult<IdentityChange> => {
      sub.end();
      signal?.removeEventListener("abort", onAbort);
      subscriptions.delete(sub);
      sub.added.clear();
      sub.deleted.clear();
      return { done: true, value: undefined };
    };
    const onAbort = () => done();
    if (this.#closed || signal?.aborted) {
      sub.ended = true;
    } else {
      for (const [id, labels] of initial) sub.added.set(id, labels);
      subscriptions.add(sub);
      signal?.addEventListener("abort", onAbort, { once: true });
    }
    return {
      async next(): Promise<IteratorResult<IdentityChange>> {
        while (true) {
          if (!sub.empty) return { done: false, value: sub.take() };
          if (sub.ended) return done();
          await new Promise<void>((resolve) => (sub.wake = resolve));
          sub.wake = undefined;
        }
      },
      return(): Promise<IteratorResult<IdentityChange>> {
        return Promise.resolve(done());
      },
      [Symbol.asyncIterator]() {
        return this;
      },
    };
  }

  /** Ends every stream once its pending batch has been taken. */
  close(): void {
    this.#closed = true;
    for (const sub of this.#subscriptions) sub.end();
  }
}
