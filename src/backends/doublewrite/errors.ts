/**
 * The double-write backend's own error: a key whose two sides cannot agree on one ID.
 *
 * @module
 */
import { ConflictError, type IdallocErrorOptions } from "../../errors.ts";

/**
 * The ID the CRD side gave a key cannot be written on the kvstore side (another key holds it
 * there, or the kvstore maps the key to another ID), or the other way round. Nothing is left
 * written by this attempt (the CRD identity it created was removed again, as Cilium does), and
 * the allocator retries it: a retry reads the sides again. It persists only while the two stores
 * disagree (drift another writer made: `idalloc doctor` shows it).
 */
export class DoubleWriteConflictError extends ConflictError {
  /** The encoded key. */
  readonly key: string;
  /** The ID the CRD side gave it. */
  readonly crdId: number;
  /** The kvstore's ID of the key, when it has another one. */
  readonly kvstoreId: number | undefined;

  /**
   * Creates the error.
   * @param key the encoded key
   * @param crdId the CRD side's ID
   * @param kvstoreId the kvstore's ID of the key, if it has another one
   * @param options the cause
   */
  constructor(
    key: string,
    crdId: number,
    kvstoreId: number | undefined,
    options?: IdallocErrorOptions,
  ) {
    super(
      kvstoreId === undefined
        ? `ID ${crdId} of key '${key}' on the CRD side is taken by another key on the kvstore side`
        : `key '${key}' is ID ${crdId} on the CRD side and ID ${kvstoreId} on the kvstore side`,
      options,
    );
    this.name = "DoubleWriteConflictError";
    this.key = key;
    this.crdId = crdId;
    this.kvstoreId = kvstoreId;
  }
}
