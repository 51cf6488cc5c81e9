/**
 * What every backend's session does alike at its edges: a call on a closing session is refused
 * (`ClosedError`), a write on a read-only one too ({@linkcode ReadOnlyError}); and a
 * session closes once: its lease stops renewing (giving the node's lease up when the session
 * holds no reference any more, so that its node name is free at once), its tasks are waited for,
 * then its owner hears of it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { TaskGroup } from "../../task_group.ts";
 * import { closeSession, writableLease } from "./session_gate.ts";
 *
 * const group = new TaskGroup("demo session");
 * const stops: boolean[] = [];
 * const lease = { close: (release?: boolean) => Promise.resolve(void stops.push(!!release)) };
 * assert.equal(writableLease(group, lease, "acquire"), lease);
 * assert.throws(() => writableLease(group, undefined, "acquire"), { name: "ReadOnlyError" });
 * await closeSession(group, { lease, release: true });
 * await closeSession(group, { lease, release: true }); // idempotent
 * assert.deepEqual(stops, [true]);
 * assert.throws(() => writableLease(group, lease, "acquire"), { name: "ClosedError" });
 * ```
 *
 * @module
 */
import { ReadOnlyError } from "../../errors.ts";
import type { TaskGroup } from "../../task_group.ts";

/** The lease a session's writes go under; stopped when the session closes. */
export interface SessionLease {
  /** Stops renewing it; `release`: give the node's lease up too (the session holds nothing). */
  close(release?: boolean): Promise<void>;
}

/**
 * The lease a write of `operation` goes under. Throws `ClosedError` once `group` (the
 * session's) is closing, and {@linkcode ReadOnlyError} without a lease (a read-only session).
 */
export function writableLease<L>(group: TaskGroup, lease: L | undefined, operation: string): L {
  group.throwIfClosed();
  if (lease === undefined) throw new ReadOnlyError(operation);
  return lease;
}

/** How {@linkcode closeSession} closes a session. */
export interface SessionClose {
  /** The session's lease, if it has one (a read-only session has none). */
  readonly lease?: SessionLease;
  /** Whether to give the node's lease up: the session holds no reference any more. */
  readonly release?: boolean;
  /** Runs once the session's tasks settled (the backend forgets the session). */
  readonly after?: () => void | Promise<void>;
}

/**
 * Closes the session whose tasks `group` tracks (see the module doc); idempotent: later calls
 * return the first call's promise.
 */
export function closeSession(group: TaskGroup, how: SessionClose): Promise<void> {
  return group.close(() => how.lease?.close(how.release), how.after);
}
