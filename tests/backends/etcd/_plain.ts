/**
 * etcd's wire shapes as plain data, for unit tests of the backend's phases without an etcd: stored
 * key-values, range responses and transaction responses.
 */
import { Buffer } from "node:buffer";
import type { IKeyValue, IResponseOp, ITxnResponse } from "../../../src/deps/etcd3.ts";

/** A stored key-value (`lease` "0": none). */
export function kv(key: string, value: string | Uint8Array, mod = "5", lease = "0"): IKeyValue {
  const b = (s: string | Uint8Array) => Buffer.from(s as string);
  return {
    key: b(key),
    value: b(value),
    mod_revision: mod,
    create_revision: mod,
    version: "1",
    lease,
  };
}

/** A range read's response. */
export function ranged(kvs: IKeyValue[]): IResponseOp {
  return { response_range: { kvs } } as unknown as IResponseOp;
}

/** A (nested) transaction's response. */
export function txn(succeeded: boolean, responses: IResponseOp[] = []): ITxnResponse {
  return { header: {} as ITxnResponse["header"], succeeded, responses };
}

/** A nested transaction's response as an operation's. */
export function nestedTxn(succeeded: boolean, responses: IResponseOp[] = []): IResponseOp {
  return { response_txn: txn(succeeded, responses) } as IResponseOp;
}
