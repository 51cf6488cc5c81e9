/**
 * Building blocks of the guarded transactions: compares, operations, and the reading of a
 * key's reference range with Cilium's exact matching.
 *
 * The central trick is the *agreement ladder*: "every reference of key K says ID N, or K has no
 * reference" cannot be one etcd compare (a `Value` compare over an empty range always fails, and
 * the range `value/K/` also holds references of keys that start with `K/`). So the write is
 * nested in up to three transactions tried in order, all in one round trip:
 * 1. every key in the range has value `N`;
 * 2. the range is empty;
 * 3. nothing in the range changed since revision R, at which our own read saw exact references
 *    that all said `N` (only when such a read exists).
 *
 * @example Join ID 300 of key K only if K's references agree, in one round trip
 * ```ts ignore
 * // ignored: needs a client of a running etcd (tests/backends/etcd/acquire.test.ts runs such txns)
 * const range = prefixRange(layout.refPrefix(key) + "/");
 * await kv.txn({
 *   compare: [valueIs(layout.masterKey(300), key)],
 *   success: [agreementLadder(range, 300, [put(refKey, "300", lease)])],
 *   failure: [read(range), read(layout.masterKey(300))],
 * });
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type {
  ICompare,
  IKeyValue,
  IRequestOp,
  IResponseOp,
  ITxnResponse,
} from "../../deps/etcd3.ts";
import { bytes } from "./client.ts";
import { parseId, prefixEnd, prefixMatchesKey } from "./layout.ts";

/**
 * A master as last read: absent (`null`) or its value and mod revision. `corrupt` marks a value
 * that cannot be any key (empty, or not UTF-8): it names nobody, so it may be repaired.
 */
export type MasterState =
  | { readonly value: string; readonly mod: string; readonly corrupt: boolean }
  | null;

/** A key range `[start, end)` in bytes. */
export interface ByteRange {
  readonly key: Buffer;
  readonly range_end: Buffer;
}

/** The range of every key starting with `prefix`. */
export function prefixRange(prefix: string): ByteRange {
  const key = bytes(prefix);
  return { key, range_end: Buffer.from(prefixEnd(key)) };
}

/** `key` does not exist (version 0). Over a range: no key in it exists. */
export function absent(target: string | ByteRange): ICompare {
  const r = typeof target === "string" ? { key: bytes(target) } : target;
  return { ...r, target: "Version", result: "Equal", version: 0 };
}

/** `key` holds `value`. Over a range: every key in it holds `value` (false for an empty range). */
export function valueIs(target: string | ByteRange, value: string): ICompare {
  const r = typeof target === "string" ? { key: bytes(target) } : target;
  return { ...r, target: "Value", result: "Equal", value: bytes(value) };
}

/** Every key in the range holds a value other than `value` (false for an empty range). */
export function valueIsNot(range: ByteRange, value: string): ICompare {
  return { ...range, target: "Value", result: "NotEqual", value: bytes(value) };
}

/** No key in the range (or `key`) was created or modified after `revision`. */
export function unchangedSince(target: string | ByteRange, revision: string): ICompare {
  const r = typeof target === "string" ? { key: bytes(target) } : target;
  return { ...r, target: "Mod", result: "Less", mod_revision: (BigInt(revision) + 1n).toString() };
}

/** `key`'s mod revision is exactly `revision`. */
export function modIs(key: string, revision: string): ICompare {
  return { key: bytes(key), target: "Mod", result: "Equal", mod_revision: revision };
}

/** Put `key` = `value`, bound to `lease` when given. */
export function put(key: string, value: string, lease?: string): IRequestOp {
  return { request_put: { key: bytes(key), value: bytes(value), lease: lease ?? 0 } };
}

/** Delete `key`. */
export function del(key: string): IRequestOp {
  return { request_delete_range: { key: bytes(key) } };
}

/** Read `key`, or every key of a range. */
export function read(target: string | ByteRange, keysOnly = false): IRequestOp {
  const r = typeof target === "string" ? { key: bytes(target) } : target;
  return { request_range: { ...r, keys_only: keysOnly } };
}

/** A nested transaction as an operation (etcd ≥ 3.3). */
export function nested(
  compare: ICompare[],
  success: IRequestOp[],
  failure: IRequestOp[],
): IRequestOp {
  return { request_txn: { compare, success, failure } };
}

/** The key-values of a range response at `index`. */
export function kvsAt(responses: IResponseOp[], index: number): IKeyValue[] {
  return responses[index]?.response_range?.kvs ?? [];
}

const decoder = new TextDecoder();

/** The text of a key or value. */
export function text(b: Buffer | Uint8Array | undefined): string {
  return b ? decoder.decode(b) : "";
}

const strictDecoder = new TextDecoder("utf-8", { fatal: true });

/** The text of a value, or `undefined` when its bytes are not UTF-8 (a corrupt entry). */
export function strictText(b: Buffer | Uint8Array | undefined): string | undefined {
  try {
    return b ? strictDecoder.decode(b) : "";
  } catch {
    return undefined;
  }
}

/**
 * A Cilium mutex that a write must find free: no key `<path>/<lease id in hex>` may exist when it
 * commits. Cilium writes a master and its reference in separate steps under that mutex
 * (`lockedAllocate`), and its GC judges and deletes a master under another (`RunGC`); a write
 * that ignored them could land between the steps.
 *
 * The mutex range `<path>/` also holds the mutexes of longer paths (`locks/a;/` covers the lock of
 * key `a;/b;`). Such a false match costs one retry, never a livelock: after a read that found no
 * key of this very path, the guard becomes "nothing in the range changed since that read", which
 * other paths' mutexes that stay put cannot fail, while a new mutex of this path must.
 */
export class MutexGuard {
  /** The mutex path (without the trailing `/`). */
  readonly path: string;
  /** The range of its keys, `<path>/`. */
  readonly range: ByteRange;
  /** Revision of the last read that found no key of this path (`undefined`: none yet). */
  #clearAt: string | undefined;

  /** @param path the mutex path, e.g. `EtcdLayout.keyLockPath(key)` */
  constructor(path: string) {
    this.path = path;
    this.range = prefixRange(path + "/");
  }

  /** The compare that holds only while no key of this mutex exists. */
  compare(): ICompare {
    return this.#clearAt === undefined
      ? absent(this.range)
      : unchangedSince(this.range, this.#clearAt);
  }

  /** Reads the mutex range (keys only), for a failure branch. */
  read(): IRequestOp {
    return read(this.range, true);
  }

  /**
   * Applies a read of the range at `revision`; returns the keys of this very mutex (empty when it
   * is free). A held mutex switches the guard back to "absent": "unchanged since" would pass while
   * the holder stays put.
   */
  learn(kvs: IKeyValue[], revision: string): string[] {
    const held = kvs.map((kv) => text(kv.key)).filter((k) => prefixMatchesKey(this.path, k));
    this.#clearAt = held.length === 0 ? revision : undefined;
    return held;
  }
}

/** A reference as read from etcd. */
export interface RefEntry {
  readonly etcdKey: string;
  /** The raw value (a decimal ID if well formed). */
  readonly value: string;
  /** The parsed ID, `undefined` when the value is corrupt. */
  readonly id: number | undefined;
  readonly modRevision: string;
  readonly lease: string;
}

/** What a read of `value/<K>/` says, with exact matching applied. */
export interface RefSnapshot {
  /** The store revision of the read. */
  readonly revision: string;
  /** References of exactly this key. */
  readonly exact: readonly RefEntry[];
  /** Keys in the range that belong to other keys (`K/…`): the reason for the ladder's step 3. */
  readonly others: number;
}

/** Splits the kvs of a read of `refPrefix + "/"` into this key's references and the others. */
export function snapshotOf(refPrefix: string, kvs: IKeyValue[], revision: string): RefSnapshot {
  const exact: RefEntry[] = [];
  let others = 0;
  for (const kv of kvs) {
    const etcdKey = text(kv.key);
    if (!prefixMatchesKey(refPrefix, etcdKey)) {
      others++;
      continue;
    }
    const value = text(kv.value);
    exact.push({
      etcdKey,
      value,
      id: parseId(value),
      modRevision: String(kv.mod_revision),
      lease: String(kv.lease),
    });
  }
  return { revision, exact, others };
}

/**
 * The agreement ladder (see the module doc) around `ops`: applied only if every exact reference
 * in `range` says `id` or there is none. `snapshot`, when given, must be a read whose exact
 * references all said `id`; it enables step 3. The innermost failure reads the range.
 */
export function agreementLadder(
  range: ByteRange,
  id: number,
  ops: IRequestOp[],
  snapshot?: RefSnapshot,
): IRequestOp {
  const last = snapshot
    ? nested([unchangedSince(range, snapshot.revision)], ops, [read(range)])
    : read(range);
  return nested(
    [valueIs(range, String(id))],
    ops,
    [nested([absent(range)], ops, [last])],
  );
}

/**
 * Walks a ladder's response (the op at the position where the ladder was placed): whether one
 * of its steps applied `ops`, and otherwise the final range read.
 */
export function ladderOutcome(
  response: IResponseOp | undefined,
): { applied: boolean; kvs?: IKeyValue[]; revision?: string } {
  let txn: ITxnResponse | undefined = response?.response_txn;
  while (txn) {
    if (txn.succeeded) return { applied: true };
    const next: IResponseOp | undefined = txn.responses[0];
    if (next?.response_txn) {
      txn = next.response_txn;
      continue;
    }
    return { applied: false, kvs: next?.response_range?.kvs ?? [] };
  }
  return { applied: false, kvs: [] };
}
