/**
 * Errors of the identity layer.
 *
 * @module
 */
import { IdallocError, type IdallocErrorOptions } from "../errors.ts";

/**
 * A label or label set that cannot be stored and read back unchanged: a `;` in a key or value, a
 * `=` in a key, an empty or malformed source, an empty key, a kvstore string that is not in
 * canonical form, or an empty label set where an identity needs labels. Nothing was written.
 */
export class LabelError extends IdallocError {
  /**
   * Creates the error.
   *
   * @param message what is wrong with the label
   * @param options the `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "LabelError";
  }
}
