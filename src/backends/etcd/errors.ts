/**
 * Errors of the etcd backend. The connection and access classes are idalloc's store-neutral ones
 * (`src/errors.ts`, re-exported here), shared with the other networked backends. Each connection or setup failure has its own class with a stable `name`, a message that names
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
import {
  IdallocError,
  type IdallocErrorOptions,
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  type TlsProblem,
} from "../../errors.ts";

export {
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  type TlsProblem,
};

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
