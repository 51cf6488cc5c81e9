/**
 * Error classes of idalloc. Every error has a stable `name` and, where it wraps another failure, a
 * `cause`. Abort is not wrapped: an aborted call rejects with the signal's own `reason` (a
 * `DOMException` named `AbortError` or `TimeoutError`), as web APIs do.
 *
 * @example Telling errors apart
 * ```ts
 * import assert from "node:assert/strict";
 * import { IdallocError, PoolExhaustedError } from "@idalloc/idalloc";
 *
 * function explain(err: unknown): string {
 *   if (err instanceof PoolExhaustedError) return "no free ID left";
 *   if (err instanceof IdallocError) return `${err.name}: ${err.message}`;
 *   throw err;
 * }
 * assert.equal(explain(new PoolExhaustedError(1, 5)), "no free ID left");
 * ```
 *
 * @module
 */

/** Options accepted by every idalloc error constructor. */
export interface IdallocErrorOptions {
  /** The failure that led to this error. */
  cause?: unknown;
}

/** Base class of every error idalloc throws. */
export class IdallocError extends Error {
  /** Whether retrying the same call later may succeed (a conflict, a store that is down). */
  readonly retryable: boolean;

  /**
   * Creates the error.
   *
   * @param message what went wrong, in one sentence
   * @param options the `cause`
   * @param retryable whether the same call may succeed later
   */
  constructor(message: string, options?: IdallocErrorOptions, retryable = false) {
    super(message, options);
    this.name = "IdallocError";
    this.retryable = retryable;
  }
}

/** Options given to an allocator or backend failed validation. `cause` holds the details. */
export class InvalidOptionsError extends IdallocError {
  /**
   * Creates the error.
   * @param message what is wrong
   * @param options the validation failure as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "InvalidOptionsError";
  }
}

/** A key that cannot be stored: empty, too large for the store, or not encodable. Nothing was written. */
export class InvalidKeyError extends IdallocError {
  /**
   * Creates the error.
   * @param message what is wrong with the key
   * @param options the `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "InvalidKeyError";
  }
}

/** An ID that is not a safe integer, or lies outside the allowed range. */
export class InvalidIdError extends IdallocError {
  /**
   * Creates the error.
   * @param message what is wrong with the ID
   * @param options the `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "InvalidIdError";
  }
}

/** Every ID in the configured range is taken (Cilium: "no more available IDs in configured space"). */
export class PoolExhaustedError extends IdallocError {
  /**
   * Creates the error.
   *
   * @param min lowest ID of the range
   * @param max highest ID of the range
   * @param options the `cause`
   */
  constructor(min: number, max: number, options?: IdallocErrorOptions) {
    super(`no more available IDs in configured space [${min}, ${max}]`, options, true);
    this.name = "PoolExhaustedError";
  }
}

/** Another writer changed the store between our read and our atomic write; retrying is safe. */
export class ConflictError extends IdallocError {
  /**
   * Creates the error.
   * @param message what collided
   * @param options the `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options, true);
    this.name = "ConflictError";
  }
}

/** The store could not be reached or did not answer in time. Retrying later is safe. */
export class StoreUnavailableError extends IdallocError {
  /**
   * Creates the error.
   * @param message what failed
   * @param options the underlying client error as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options, true);
    this.name = "StoreUnavailableError";
  }
}

/** Allocation gave up after its bounded number of attempts. `cause` is the last attempt's error. */
export class AllocationFailedError extends IdallocError {
  /**
   * Creates the error.
   *
   * @param key the encoded key
   * @param attempts how many attempts were made
   * @param options the last error as `cause`
   */
  constructor(key: string, attempts: number, options?: IdallocErrorOptions) {
    super(`allocation of key '${key}' failed after ${attempts} attempts`, options);
    this.name = "AllocationFailedError";
  }
}

/**
 * The store's references of one key name different IDs: a split that another writer made (for
 * example a Cilium node racing a writer that ignored its lock). idalloc never adds a reference to
 * either side; an operator must remove the wrong references (`idalloc status` lists such keys).
 */
export class SplitKeyError extends IdallocError {
  /** The encoded key. */
  readonly key: string;
  /** The IDs its references name, ascending. */
  readonly ids: readonly number[];

  /**
   * Creates the error.
   *
   * @param key the encoded key
   * @param ids the IDs its references name
   * @param options the `cause`
   */
  constructor(key: string, ids: readonly number[], options?: IdallocErrorOptions) {
    const sorted = [...new Set(ids)].sort((a, b) => a - b);
    super(
      `references of key '${key}' name different IDs (${sorted.join(", ")}); ` +
        "refusing to add one: remove the wrong references",
      options,
    );
    this.name = "SplitKeyError";
    this.key = key;
    this.ids = sorted;
  }
}

/**
 * Another writer holds a lock on the key or ID (a Cilium node's etcd mutex under
 * `<prefix>/locks/`). Retrying is safe: the allocator waits with backoff until the lock is released
 * or its holder's lease lapses, bounded by the caller's signal.
 */
export class KeyLockedError extends IdallocError {
  /** The lock keys found, as stored. */
  readonly locks: readonly string[];

  /**
   * Creates the error.
   *
   * @param what the key or ID that is locked
   * @param locks the lock keys found
   * @param options the `cause`
   */
  constructor(what: string, locks: readonly string[], options?: IdallocErrorOptions) {
    super(`${what} is locked by another writer (${locks.join(", ")})`, options, true);
    this.name = "KeyLockedError";
    this.locks = [...locks];
  }
}

/** `release` of a key this allocator does not hold (Cilium: "unable to find key in local cache"). */
export class KeyNotHeldError extends IdallocError {
  /**
   * Creates the error.
   * @param key the encoded key
   * @param options the `cause`
   */
  constructor(key: string, options?: IdallocErrorOptions) {
    super(`key '${key}' is not held by this allocator`, options);
    this.name = "KeyNotHeldError";
  }
}

/** The allocator or backend was used after `close()`. */
export class ClosedError extends IdallocError {
  /**
   * Creates the error.
   * @param what the closed object
   * @param options the `cause`
   */
  constructor(what: string, options?: IdallocErrorOptions) {
    super(`${what} is closed`, options);
    this.name = "ClosedError";
  }
}

/** A write was attempted through an allocator opened with `readOnly: true`. */
export class ReadOnlyError extends IdallocError {
  /**
   * Creates the error.
   * @param operation the refused operation
   * @param options the `cause`
   */
  constructor(operation: string, options?: IdallocErrorOptions) {
    super(`'${operation}' is not allowed on a read-only allocator`, options);
    this.name = "ReadOnlyError";
  }
}

/** An entry in the store does not have the expected shape. It is logged and skipped, never thrown to users of a list. */
export class CorruptEntryError extends IdallocError {
  /**
   * Creates the error.
   * @param message which entry and why
   * @param options the validation failure as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "CorruptEntryError";
  }
}

/**
 * An operator's delete (`removeDamage`, `BackendAdmin.deleteReference`, `idalloc doctor --fix`,
 * `idalloc release --node`) refused an entry that a live node holds: an etcd entry bound to a live
 * lease, a Deno KV reference whose node's lease is live, or an entry of a key or ID that live
 * references name. Deleting it would take an ID from under a running node (another key could then
 * get it), and the node would write it back anyway. Nothing was deleted; stop the holders (their
 * references go with their leases) or let them repair the entry, then try again.
 */
export class LiveEntryError extends IdallocError {
  /** The entry, in the form the tool shows it (an etcd key, a Deno KV key tuple). */
  readonly entry: string;
  /** The live nodes (or, for an etcd lease no reference names, `lease <id>`) that hold it. */
  readonly holders: readonly string[];

  /**
   * Creates the error.
   *
   * @param entry the entry that was not deleted
   * @param holders the live nodes that hold it
   * @param options the `cause`
   */
  constructor(entry: string, holders: readonly string[], options?: IdallocErrorOptions) {
    super(
      `${entry} is held by live ${holders.length === 1 ? "node" : "nodes"} ` +
        `${holders.join(", ")}: not deleted (stop ${holders.length === 1 ? "it" : "them"} ` +
        "first; their references go with their leases)",
      options,
    );
    this.name = "LiveEntryError";
    this.entry = entry;
    this.holders = [...holders];
  }
}

/**
 * A writable session was opened under a node name whose lease is live: another process (or
 * another session of this one) is that node and still renews its lease. Taking its lease record
 * over would cut that node's references, and GC could then give its IDs to other keys while it
 * runs. Nothing was written. Use another node name, stop that node, or wait until its lease has
 * lapsed (`expiresAt`); a process that is that node restarting (the old process is gone, its
 * lease has not lapsed yet) opens with `restart: true`. Not retryable as is.
 */
export class NodeInUseError extends IdallocError {
  /** The node name asked for. */
  readonly node: string;
  /** When the live lease lapses unless renewed (ms since the epoch, the holder's clock), if known. */
  readonly expiresAt?: number;

  /**
   * Creates the error.
   *
   * @param node the node name
   * @param expiresAt when the holder's lease lapses unless renewed, if known
   * @param options the `cause`
   */
  constructor(node: string, expiresAt?: number, options?: IdallocErrorOptions) {
    const until = expiresAt === undefined
      ? ""
      : ` until ${new Date(expiresAt).toISOString()} unless renewed`;
    super(
      `node ${node} is in use: another session (in this process or another) holds its live ` +
        `lease${until}; use another node name, stop that node, or, if this process is that node ` +
        "restarting, open with restart: true",
      options,
    );
    this.name = "NodeInUseError";
    this.node = node;
    if (expiresAt !== undefined) this.expiresAt = expiresAt;
  }
}

// Connection and access failures that any networked backend (etcd, the Kubernetes API) reports.

/**
 * The store refused the credentials (etcd: a wrong user or password, an invalid auth token; the
 * Kubernetes API: 401) or the user lacks the permission the request needs (etcd: no role granting
 * the prefix; the Kubernetes API: 403, no RBAC rule). Retrying the same call with the
 * same credentials cannot succeed, so it is not retryable. `cause` holds the client's error.
 */
export class StoreAccessDeniedError extends IdallocError {
  /**
   * Creates the error.
   * @param message what was refused, and etcd's reason
   * @param options the client's error as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options, false);
    this.name = "StoreAccessDeniedError";
  }
}

/**
 * The host name of the endpoint(s) does not resolve (DNS). Retryable, like any
 * {@linkcode StoreUnavailableError}: a name may appear later, but usually it is misspelt.
 */
export class StoreHostNotFoundError extends StoreUnavailableError {
  /** The host name that did not resolve. */
  readonly host: string;

  /**
   * Creates the error.
   * @param message which host, of which endpoint
   * @param host the host name
   * @param options the client's error as `cause`
   */
  constructor(message: string, host: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "StoreHostNotFoundError";
    this.host = host;
  }
}

/**
 * The endpoint(s) refused the TCP connection: nothing listens on that port (the store is down
 * or starting, or the port is wrong). Retryable.
 */
export class StoreConnectionRefusedError extends StoreUnavailableError {
  /**
   * Creates the error.
   * @param message which endpoint
   * @param options the client's error as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "StoreConnectionRefusedError";
  }
}

/** What went wrong with TLS, in {@linkcode StoreTlsError.problem}. */
export type TlsProblem =
  /** The CA or client certificate given is not a PEM certificate. */
  | "not-a-certificate"
  /** The server's certificate is not signed by the CA given. */
  | "untrusted"
  /** The server's certificate does not name the host (or the server name given). */
  | "name-mismatch"
  /** The name to verify is an IP address, which Deno's TLS cannot send as server name (SNI). */
  | "ip-server-name"
  /** The server demands a client certificate it accepts (mutual TLS). */
  | "client-certificate"
  /** The server does not speak TLS (a plain-text store). */
  | "not-tls"
  /** The server speaks TLS, but no TLS settings were given. */
  | "tls-required"
  /** Any other handshake failure. */
  | "handshake";

/**
 * TLS to the store cannot work as configured: `problem` says why ({@linkcode TlsProblem}), the message
 * says it in words with the endpoint. A setup mistake: not retryable.
 */
export class StoreTlsError extends IdallocError {
  /** What went wrong. */
  readonly problem: TlsProblem;

  /**
   * Creates the error.
   * @param message what went wrong, with the endpoint
   * @param problem the kind of problem
   * @param options the client's error as `cause`
   */
  constructor(message: string, problem: TlsProblem, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "StoreTlsError";
    this.problem = problem;
  }
}

/** The message of a thrown value, whatever was thrown (an `Error` or anything else). */
export function errorMessage(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
