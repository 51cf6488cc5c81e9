/**
 * Group commit for etcd: transactions that arrive while one is in flight share the next request,
 * each as a nested transaction (etcd ≥ 3.3) with its own compares, so every key keeps its own
 * guard and one key's failed compare never fails its batch-mates. The first transaction goes out
 * at once, alone and unwrapped: an idle node pays no latency and no nesting.
 *
 * Limits: at most {@linkcode MAX_BATCH} transactions a request (etcd's `--max-txn-ops` is 128 a
 * level, and nested levels get what their parent leaves), at most `BATCH_BYTES` of keys and values,
 * and never two transactions that write the same key (etcd refuses duplicate keys in one request).
 *
 * A request refused as a whole for a reason that belongs to one transaction ("lease not found",
 * too large) is retried one transaction at a time, so the error reaches the right caller.
 *
 * @example Two acquisitions issued together cost one request when one is already in flight
 * ```ts ignore
 * // ignored: needs a client of a running etcd (tests/backends/etcd/batch.test.ts runs it)
 * const batcher = new TxnBatcher(client, closingSignal);
 * const [a, b] = await Promise.all([
 *   batcher.run("acquire", txnA, signal),
 *   batcher.run("acquire", txnB, signal),
 * ]);
 * ```
 *
 * @module
 */
import type { ICompare, IRequestOp, IResponseOp, ITxnResponse } from "../../deps/etcd3.ts";
import { type EtcdClient, LeaseNotFound, ResponseTooLarge } from "./client.ts";
import { BATCH_BYTES, MAX_BATCH } from "./limits.ts";
import { nested } from "./txn.ts";
import { GroupCommit, type Member, settle } from "../shared/group_commit.ts";

/** One transaction, as `etcd3`'s raw `kv.txn` takes it. */
export interface TxnRequest {
  readonly compare: ICompare[];
  readonly success: IRequestOp[];
  readonly failure: IRequestOp[];
}

/** What one transaction of a batch came back with. */
export interface TxnResult {
  /** Whether its compares held. */
  readonly succeeded: boolean;
  /** The responses of the branch it took. */
  readonly responses: IResponseOp[];
  /** The store revision after the request. */
  readonly revision: string;
}

/** One transaction of a batch. */
type Pending = Member<{ readonly what: string; readonly txn: TxnRequest }, TxnResult>;

/** Counters of a batcher, for benchmarks and tests. */
export interface BatchStats {
  /** Requests sent. */
  requests: number;
  /** Transactions sent (each request carries one or more). */
  transactions: number;
  /** The largest batch so far. */
  largest: number;
}

/** Groups concurrent transactions of one connection (see the module doc). */
export class TxnBatcher {
  /** Request counters. */
  readonly stats: BatchStats = { requests: 0, transactions: 0, largest: 0 };
  readonly #client: EtcdClient;
  readonly #closing: AbortSignal;
  readonly #group: GroupCommit<Pending["payload"], TxnResult>;

  /**
   * @param client the connection
   * @param closing aborted when the owner closes (a batch in flight is not tied to any one caller)
   * @param enabled false: every transaction is its own request, sent at once
   */
  constructor(client: EtcdClient, closing: AbortSignal, enabled = true) {
    this.#client = client;
    this.#closing = closing;
    this.#group = new GroupCommit({
      enabled,
      limits: [MAX_BATCH, BATCH_BYTES],
      measure: ({ txn }) => ({ writes: writtenKeys(txn), weights: [1, txnBytes(txn)] }),
      send: (batch) => this.#send(batch),
    });
  }

  /**
   * Runs `txn` (counted as operation `what`), alone when nothing is in flight, else in the next
   * batch. Rejects with `signal.reason` when it aborts; a transaction already sent may still apply.
   */
  run(what: string, txn: TxnRequest, signal: AbortSignal): Promise<TxnResult> {
    return this.#group.submit({ what, txn }, signal);
  }

  async #send(batch: Pending[]): Promise<void> {
    this.stats.requests++;
    this.stats.transactions += batch.length;
    this.stats.largest = Math.max(this.stats.largest, batch.length);
    const what = batch[0].payload.what;
    this.#client.telemetry.batch(what, batch.length);
    if (batch.length === 1) return await this.#sendOne(batch[0]);
    let res: ITxnResponse;
    try {
      res = await this.#client.call(what, this.#closing, (o) =>
        this.#client.raw.kv.txn({
          success: batch.map(({ payload: { txn } }) =>
            nested(txn.compare, txn.success, txn.failure)
          ),
        }, o));
    } catch (err) {
      if (err instanceof LeaseNotFound || err instanceof ResponseTooLarge) {
        // The error belongs to some of them: find out which, one at a time.
        for (const p of batch) await this.#sendOne(p);
        return;
      }
      for (const p of batch) settle(p, () => p.reject(err));
      return;
    }
    const revision = String(res.header.revision);
    batch.forEach((p, i) => {
      const inner = res.responses[i]?.response_txn;
      settle(
        p,
        () =>
          inner
            ? p.resolve({ succeeded: inner.succeeded, responses: inner.responses, revision })
            : p.reject(
              new Error("etcd answered a batch without the nested transaction's response"),
            ),
      );
    });
  }

  async #sendOne(p: Pending): Promise<void> {
    if (p.settled) return;
    const { what, txn } = p.payload;
    try {
      const res = await this.#client.call(
        what,
        p.signal,
        (o) => this.#client.raw.kv.txn({ ...txn }, o),
      );
      settle(p, () =>
        p.resolve({
          succeeded: res.succeeded,
          responses: res.responses,
          revision: String(res.header.revision),
        }));
    } catch (err) {
      settle(p, () => p.reject(err));
    }
  }
}

/** The keys a transaction may put or delete, on either branch (nested ones included). */
function writtenKeys(txn: TxnRequest): Set<string> {
  const keys = new Set<string>();
  const visit = (ops: IRequestOp[]) => {
    for (const op of ops) {
      const key = op.request_put?.key ?? op.request_delete_range?.key;
      if (key) keys.add(key.toString("latin1"));
      const t = op.request_txn;
      if (t) {
        visit(t.success ?? []);
        visit(t.failure ?? []);
      }
    }
  };
  visit(txn.success);
  visit(txn.failure);
  return keys;
}

/** A generous estimate of a transaction's size on the wire. */
function txnBytes(txn: TxnRequest): number {
  let n = 0;
  const add = (b: { length: number } | undefined) => (n += (b?.length ?? 0) + 16);
  const visit = (ops: IRequestOp[]) => {
    for (const op of ops) {
      add(op.request_put?.key);
      add(op.request_put?.value);
      add(op.request_delete_range?.key);
      add(op.request_range?.key);
      add(op.request_range?.range_end);
      const t = op.request_txn;
      if (t) {
        for (const c of t.compare ?? []) (add(c.key), add(c.range_end), add(c.value));
        visit(t.success ?? []);
        visit(t.failure ?? []);
      }
    }
  };
  for (const c of txn.compare) (add(c.key), add(c.range_end), add(c.value));
  visit(txn.success);
  visit(txn.failure);
  return n;
}
