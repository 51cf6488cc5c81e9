/**
 * The shutdown pattern every long-lived part shares (the allocator, the identity allocator, each
 * backend's session): one closing signal, a set of background tasks, and an idempotent close that
 * aborts the signal and waits for every task to settle.
 *
 * Tasks are awaited with `allSettled`: a task that fails while the group closes must not keep
 * `close()` from finishing the rest of its work (releasing a lease, closing the session).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { TaskGroup } from "./task_group.ts";
 *
 * const group = new TaskGroup("example");
 * let stopped = false;
 * group.spawn(new Promise<void>((resolve) => {
 *   group.signal.addEventListener("abort", () => {
 *     stopped = true;
 *     resolve();
 *   });
 * }));
 * await group.close();
 * assert.equal(stopped, true);
 * assert.equal(group.closed, true);
 * ```
 * @module
 */
import { ClosedError } from "./errors.ts";

/** Background tasks that stop together: see the module documentation. */
export class TaskGroup {
  readonly #what: string;
  readonly #closing = new AbortController();
  readonly #tasks = new Set<Promise<unknown>>();
  #closed: Promise<void> | undefined;

  /** `what` names the owner in the {@linkcode ClosedError} the signal is aborted with. */
  constructor(what: string) {
    this.#what = what;
  }

  /** Aborted when {@linkcode TaskGroup.close} starts, with a {@linkcode ClosedError}. */
  get signal(): AbortSignal {
    return this.#closing.signal;
  }

  /** Whether {@linkcode TaskGroup.close} has started. */
  get closed(): boolean {
    return this.#closing.signal.aborted;
  }

  /** `signal` and the group's closing signal combined (the group's alone without one). */
  bound(signal?: AbortSignal): AbortSignal {
    return signal ? AbortSignal.any([signal, this.#closing.signal]) : this.#closing.signal;
  }

  /**
   * Tracks `task` until it settles. A rejection is passed to `onError` unless the group is closing
   * (a task stopped by the closing signal is not a failure); without `onError` it is dropped here,
   * so callers that care must handle it.
   */
  spawn(task: Promise<unknown>, onError?: (err: unknown) => void): void {
    const tracked = task.catch((err) => {
      if (!this.closed) onError?.(err);
    }).finally(() => this.#tasks.delete(tracked));
    this.#tasks.add(tracked);
  }

  /** Throws {@linkcode ClosedError} once the group is closing. */
  throwIfClosed(): void {
    if (this.closed) throw new ClosedError(this.#what);
  }

  /**
   * Aborts the signal, runs `beforeWait` (e.g. stopping a lease, whose renewal is a task too),
   * waits for every task to settle, then runs `afterWait`. Idempotent: later calls return the
   * first call's promise.
   */
  close(
    beforeWait?: () => void | Promise<void>,
    afterWait?: () => void | Promise<void>,
  ): Promise<void> {
    this.#closed ??= (async () => {
      this.#closing.abort(new ClosedError(this.#what));
      await beforeWait?.();
      await Promise.allSettled([...this.#tasks]);
      await afterWait?.();
    })();
    return this.#closed;
  }
}
