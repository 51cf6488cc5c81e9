/**
 * Errors of the etcd backend that have no counterpart in idalloc's store-neutral error classes.
 *
 * @example Telling a refused login from a store that is down
 * ```ts
 * import { StoreAccessDeniedError } from "./errors.ts";
 *
 * const err: unknown = new StoreAccessDeniedError("etcd connect refused: authentication failed");
 * if (err instanceof StoreAccessDeniedError) console.log(`${err.name}, retryable: ${err.retryable}`);
 * ```
 *
 * @module
 */
import { IdallocError, type IdallocErrorOptions } from "../../errors.ts";

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
