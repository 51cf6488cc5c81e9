/**
 * Errors of the etcd backend that have no counterpart in idalloc's store-neutral error classes.
 * Each connection or setup failure has its own class with a stable `name`, a message that names
 * the endpoint in plain words, and the client's raw error as `cause`:
 *
 * | class                         | what happened                                  | retryable |
 * | ----------------------------- | ---------------------------------------------- | --------- |
 * | {@linkcode StoreHostNotFoundError}      | an endpoint's host name does not resolve | yes |
 * | {@linkcode StoreConnectionRefusedError} | nothing listens on the endpoint's port   | yes |
 * | {@linkcode StoreTlsError}               | TLS setup or handshake failed (`problem`) | no  |
 * | {@linkcode NotEtcdServerError}          | something answers, but not etcd          | no  |
 * | {@linkcode AuthNotEnabledError}         | credentials given to an etcd without auth | no  |
 * | {@linkcode StoreAccessDeniedError}      | etcd refused the credentials or permission | no |
 *
 * The first two are {@linkcode StoreUnavailableError}s (the store may come up); the others are
 * mistakes of the setup that retrying cannot fix.
 *
 * @example Telling a refused login from a store that is down
 * ```ts
 * import assert from "node:assert/strict";
 * import { StoreAccessDeniedError } from "./errors.ts";
 *
 * const err: unknown = new StoreAccessDeniedError("etcd connect refused: authentication failed");
 * assert.ok(err instanceof StoreAccessDeniedError);
 * assert.equal(err.name, "StoreAccessDeniedError");
 * assert.equal(err.retryable, false); // credentials the store denies stay denied
 * ```
 *
 * @module
 */
import { IdallocError, type IdallocErrorOptions, StoreUnavailableError } from "../../errors.ts";

/**
 * etcd refused the credentials (wrong user or password, an invalid auth token) or the user lacks
 * the permission the request needs (no role granting the prefix). Retrying the same call with the
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
 * A user name and password were given, but etcd has authentication turned off (etcd: "authentication
 * is not enabled"). etcd refuses every request that carries credentials then, so this is a setup
 * mistake: connect without `user`/`password`, or enable authentication in etcd. Not retryable.
 */
export class AuthNotEnabledError extends StoreAccessDeniedError {
  /**
   * Creates the error.
   * @param message which etcd, and what to do
   * @param options the client's error as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "AuthNotEnabledError";
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
 * The endpoint(s) refused the TCP connection: nothing listens on that port (etcd is down or
 * starting, or the port is wrong). Retryable.
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
  /** The server does not speak TLS (a plain-text etcd). */
  | "not-tls"
  /** The server speaks TLS, but no TLS settings were given. */
  | "tls-required"
  /** Any other handshake failure. */
  | "handshake";

/**
 * TLS to etcd cannot work as configured: `problem` says why ({@linkcode TlsProblem}), the message
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

/**
 * Something answers at the endpoint, but not etcd's gRPC API: an HTTP/1 server, an HTTP/2 or gRPC
 * server that does not serve etcd (HTTP 404, an unknown service). The endpoint's host or port is
 * wrong. Not retryable.
 */
export class NotEtcdServerError extends IdallocError {
  /**
   * Creates the error.
   * @param message which endpoint, and what answered
   * @param options the client's error as `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "NotEtcdServerError";
  }
}
