/**
 * One async mutex per key. Allocation, release, the periodic sync and master-key protection of
 * one key are serialised through it, which is what prevents Cilium's #35451 (a sync re-creating a
 * reference that a concurrent release has just deleted).
 *
 * @module
 */
import { abortable } from "../abort.ts";

/** Per-key FIFO mutex; entries vanish when unlocked with no waiters. */
export class KeyedMutex {
  readonly #tails = new Map<string, Promise<void>>();

  /** Waits for `key`'s lock; the returned Disposable unlocks. Rejects with `signal.reason` on abort. */
  async lock(key: string, signal?: AbortSignal): Promise<Disposable> {
    signal?.throwIfAborted();
    const previous = this.#tails.get(key);
    let unlock!: () => void;
    const mine = new Promise<void>((resolve) => (unlock = resolve));
    // Our tail waits for the previous holder even if we abort, so the chain order stays intact.
    const tail = previous ? previous.then(() => mine) : mine;
    this.#tails.set(key, tail);
    const release = () => {
      unlock();
      if (this.#tails.get(key) === tail) this.#tails.delete(key);
    };
    if (previous) {
      try {
        await abortable(previous, signal);
      } catch (err) {
        release();
        throw err;
      }
    }
    return { [Symbol.dispose]: release };
  }
}
