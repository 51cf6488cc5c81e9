/**
 * A Cilium v1.13 node as far as the allocator's etcd protocol goes, written step by step on the
 * etcd3 client (Cilium's Go code cannot run here): `Allocator.lockedAllocate` with its etcd mutex
 * (`concurrency.Mutex` on the node's lock lease at `<base>/locks/<key>/<lease hex>`), and
 * `kvstoreBackend.RunGC`'s per-ID step under the mutex `<base>/locks/id/<ID>`.
 *
 * Every step is a yield point of an async generator, so a test can stop the double between any
 * two of its writes and run idalloc there, deterministically.
 *
 * @example Stop a Cilium allocation after it created its master
 * ```ts ignore
 * // Needs a running etcd and a raw client; tests/backends/etcd/cilium_lock.test.ts runs it.
 * await using cilium = await CiliumDouble.start(raw, base, "cilium-a");
 * const steps = cilium.allocateSteps("k;", () => 1759);
 * await runUntil(steps, "master-created");
 * // … idalloc acts here …
 * const id = await finish(steps);
 * ```
 *
 * @module
 */
import type { Etcd3, ICompare, IKeyValue, IRequestOp, Lease } from "etcd3";
import { goJoin, parseId, prefixEnd, prefixMatchesKey } from "../../src/backends/etcd/layout.ts";
import { EtcdLayout } from "../../src/backends/etcd/layout.ts";
import { b } from "../../src/backends/etcd/testing/fixture.ts";
import { Buffer } from "node:buffer";

/** The steps of `lockedAllocate`, in order (a join skips the master). */
export type AllocateStep =
  | "locked"
  | "refs-read"
  | "checked"
  | "master-created"
  | "ref-created"
  | "unlocked";

/** The steps of `UpdateKey` (master-key protection, the local-key sync). */
export type UpdateKeyStep = "master-written" | "ref-written";

/** The steps of one ID in `RunGC`. */
export type GcStep = "locked" | "refs-read" | "master-deleted" | "unlocked";

/** A Cilium allocation attempt that failed the way `lockedAllocate` fails (Allocate retries). */
export class CiliumAttemptError extends Error {
  /** @param message Cilium's reason */
  constructor(message: string) {
    super(message);
    this.name = "CiliumAttemptError";
  }
}

interface Mutex {
  readonly key: string;
  readonly rev: string;
}

const decoder = new TextDecoder();
const text = (v: Uint8Array | undefined) => (v ? decoder.decode(v) : "");

/** Options of {@linkcode CiliumDouble.start}. */
export interface CiliumDoubleOptions {
  /** TTL of the data lease its references live on, in seconds. @default {60} */
  readonly leaseTtl?: number;
  /** TTL of the lock lease its mutex keys live on (Cilium: 25 s). @default {25} */
  readonly lockLeaseTtl?: number;
  /** Renew both leases (a live node); off simulates a node that dies with them. @default {true} */
  readonly keepAlive?: boolean;
}

/** One Cilium node (see the module doc). */
export class CiliumDouble implements AsyncDisposable {
  /** The node's name (Cilium: its IP), the last segment of its references. */
  readonly node: string;
  /** The lease its references are written on. */
  readonly dataLease: string;
  /** The lease its mutex keys are written on. */
  readonly lockLease: string;
  /** Cilium's `localKeys`: the keys this node holds and their IDs. */
  readonly local = new Map<string, number>();
  readonly #raw: Etcd3;
  readonly #layout: EtcdLayout;
  readonly #leases: Lease[];

  private constructor(
    raw: Etcd3,
    layout: EtcdLayout,
    node: string,
    leases: Array<{ lease: Lease; id: string }>,
  ) {
    this.#raw = raw;
    this.#layout = layout;
    this.node = node;
    this.#leases = leases.map((l) => l.lease);
    [this.dataLease, this.lockLease] = leases.map((l) => l.id);
  }

  /** Grants the node's leases on `raw` for the layout under `base`. */
  static async start(
    raw: Etcd3,
    base: string,
    node: string,
    options: CiliumDoubleOptions = {},
  ): Promise<CiliumDouble> {
    const autoKeepAlive = options.keepAlive ?? true;
    const leases = [];
    for (const ttl of [options.leaseTtl ?? 60, options.lockLeaseTtl ?? 25]) {
      const lease = raw.lease(ttl, { autoKeepAlive });
      leases.push({ lease, id: String(await lease.grant()) });
    }
    return new CiliumDouble(raw, new EtcdLayout(base), node, leases);
  }

  /**
   * Cilium's `lockedAllocate(key)`, yielding after each step; returns the ID, or throws
   * {@linkcode CiliumAttemptError} where Cilium's attempt fails (its `Allocate` then retries).
   * `pickId` stands in for Cilium's pool (`selectAvailableID`).
   */
  async *allocateSteps(
    key: string,
    pickId: () => number,
  ): AsyncGenerator<AllocateStep, number> {
    const mutex = await this.#lock(this.#layout.keyLockPath(key));
    let unlocked = false;
    try {
      yield "locked";
      let value = await this.#getIfLocked(key, mutex);
      yield "refs-read";
      if (value === 0 && this.local.has(key)) {
        // The store lost the key but this node still holds it: re-create the master.
        value = this.local.get(key)!;
        await this.#createOnlyIfLocked(this.#layout.masterKey(value), key, mutex);
        yield "master-created";
      }
      if (value !== 0) {
        await this.#acquireReference(key, value, mutex);
        this.local.set(key, value);
        yield "ref-created";
        await this.#unlock(mutex);
        unlocked = true;
        yield "unlocked";
        return value;
      }
      const id = pickId();
      // Cilium's GetNoCache after selecting an ID: someone may have allocated the key meanwhile.
      if (await this.get(key) !== 0) {
        throw new CiliumAttemptError(`Found master key after proceeding with new allocation`);
      }
      yield "checked";
      if (!await this.#createOnlyIfLocked(this.#layout.masterKey(id), key, mutex)) {
        throw new CiliumAttemptError(`unable to allocate ID ${id} for key ${key}`);
      }
      yield "master-created";
      await this.#acquireReference(key, id, mutex);
      this.local.set(key, id);
      yield "ref-created";
      await this.#unlock(mutex);
      unlocked = true;
      yield "unlocked";
      return id;
    } finally {
      if (!unlocked) await this.#unlock(mutex);
    }
  }

  /**
   * Cilium's `kvstoreBackend.UpdateKey(id, key, reliablyMissing)`, as master-key protection
   * (`reliablyMissing`) and the local-key sync (`syncLocalKeys`) call it: no mutex, and no look
   * at the key's other masters. `CreateOnly` of the master, then of the node's reference
   * (`reliablyMissing`) or `UpdateIfDifferent` of it (re-put when missing, different or on
   * another lease). Yields after each write; the node holds the key as `id` afterwards.
   */
  async *updateKeySteps(
    key: string,
    id: number,
    reliablyMissing = true,
  ): AsyncGenerator<UpdateKeyStep, void> {
    const masterKey = b(this.#layout.masterKey(id));
    await this.#raw.kv.txn({
      compare: [{ key: masterKey, target: "Create", result: "Equal", create_revision: 0 }],
      success: [{ request_put: { key: masterKey, value: b(key) } }],
      failure: [],
    });
    yield "master-written";
    const refKey = b(this.#layout.refKey(key, this.node));
    const put = { request_put: { key: refKey, value: b(String(id)), lease: this.dataLease } };
    if (reliablyMissing) {
      await this.#raw.kv.txn({
        compare: [{ key: refKey, target: "Create", result: "Equal", create_revision: 0 }],
        success: [put],
        failure: [],
      });
    } else {
      const cur = (await this.#raw.kv.range({ key: refKey })).kvs[0];
      if (!cur || text(cur.value) !== String(id) || String(cur.lease) !== this.dataLease) {
        await this.#raw.kv.put(put.request_put);
      }
    }
    this.local.set(key, id);
    yield "ref-written";
  }

  /** {@linkcode CiliumDouble.updateKeySteps} to its end. */
  async updateKey(key: string, id: number, reliablyMissing = true): Promise<void> {
    await finish(this.updateKeySteps(key, id, reliablyMissing));
  }

  /** Cilium's `Allocate`: `lockedAllocate` retried on failure, up to `attempts` times. */
  async allocate(key: string, pickId: () => number, attempts = 16): Promise<number> {
    let last: unknown;
    for (let i = 0; i < attempts; i++) {
      try {
        return await finish(this.allocateSteps(key, pickId));
      } catch (err) {
        if (!(err instanceof CiliumAttemptError)) throw err;
        last = err;
        await new Promise((r) => setTimeout(r, 2 + Math.random() * 10 * (i + 1)));
      }
    }
    throw last;
  }

  /**
   * One ID of Cilium's `RunGC`, yielding after each step: lock `locks/id/<id>`, list the master
   * key's references under the lock, delete the master if none (the two-round marking is the
   * caller's). Returns whether it deleted.
   */
  async *gcSteps(id: number): AsyncGenerator<GcStep, boolean> {
    const masterKey = this.#layout.masterKey(id);
    const master = await this.#raw.kv.range({ key: b(masterKey) });
    const owner = master.kvs[0] ? text(master.kvs[0].value) : undefined;
    if (owner === undefined) return false;
    const mutex = await this.#lock(this.#layout.idLockPath(id));
    try {
      yield "locked";
      const prefix = goJoin(this.#layout.valuePrefix, owner);
      const refs = await this.#ifLocked(mutex, [readPrefix(prefix)]);
      const users = refs[0].filter((kv) => prefixMatchesKey(prefix, text(kv.key)));
      yield "refs-read";
      if (users.length > 0) return false;
      await this.#ifLocked(mutex, [{ request_delete_range: { key: b(masterKey) } }]);
      yield "master-deleted";
      return true;
    } finally {
      await this.#unlock(mutex);
    }
  }

  /** Cilium's `Get` (unlocked): the ID of the first exact reference of `key`, else 0. */
  async get(key: string): Promise<number> {
    const prefix = goJoin(this.#layout.valuePrefix, key);
    const res = await this.#raw.kv.range(readPrefix(prefix).request_range!);
    return firstId(prefix, res.kvs);
  }

  /** Cilium's `Release` of the node's last local use: delete its reference. */
  async release(key: string): Promise<void> {
    this.local.delete(key);
    await this.#raw.kv.deleteRange({ key: b(this.#layout.refKey(key, this.node)) });
  }

  async #getIfLocked(key: string, mutex: Mutex): Promise<number> {
    const prefix = goJoin(this.#layout.valuePrefix, key);
    const [kvs] = await this.#ifLocked(mutex, [readPrefix(prefix)]);
    return firstId(prefix, kvs);
  }

  /** `CreateOnlyIfLocked`: put if absent, while the mutex is ours; false if the key exists. */
  async #createOnlyIfLocked(etcdKey: string, value: string, mutex: Mutex): Promise<boolean> {
    const res = await this.#raw.kv.txn({
      compare: [{ key: b(etcdKey), target: "Version", result: "Equal", version: 0 }, owns(mutex)],
      success: [{ request_put: { key: b(etcdKey), value: b(value) } }],
      failure: [{ request_range: { key: b(etcdKey) } }],
    });
    if (res.succeeded) return true;
    if ((res.responses[0]?.response_range?.kvs ?? []).length > 0) return false;
    throw new CiliumAttemptError("lock lease expired");
  }

  /** `AcquireReference` = `UpdateIfDifferentIfLocked(value/<key>/<node>, id, lease)`. */
  async #acquireReference(key: string, id: number, mutex: Mutex): Promise<void> {
    const refKey = this.#layout.refKey(key, this.node);
    const [kvs] = await this.#ifLocked(mutex, [{ request_range: { key: b(refKey) } }]);
    const cur = kvs[0];
    if (cur && text(cur.value) === String(id) && String(cur.lease) === this.dataLease) return;
    await this.#ifLocked(mutex, [{
      request_put: { key: b(refKey), value: b(String(id)), lease: this.dataLease },
    }]);
  }

  /** A txn guarded by the mutex's `Comparator()`; the kvs of each range op. */
  async #ifLocked(mutex: Mutex, ops: IRequestOp[]): Promise<IKeyValue[][]> {
    const res = await this.#raw.kv.txn({ compare: [owns(mutex)], success: ops, failure: [] });
    if (!res.succeeded) throw new CiliumAttemptError("lock lease expired");
    return res.responses.map((r) => r.response_range?.kvs ?? []);
  }

  /** `concurrency.Mutex.Lock`: enqueue `<path>/<lease hex>`, wait for older holders to go. */
  async #lock(path: string): Promise<Mutex> {
    const pfx = path + "/";
    const key = pfx + BigInt(this.lockLease).toString(16);
    const owner = {
      request_range: {
        key: b(pfx),
        range_end: Buffer.from(prefixEnd(b(pfx))),
        sort_order: "Ascend" as const,
        sort_target: "Create" as const,
        limit: 1,
      },
    };
    const res = await this.#raw.kv.txn({
      compare: [{ key: b(key), target: "Create", result: "Equal", create_revision: 0 }],
      success: [{ request_put: { key: b(key), value: b(""), lease: this.lockLease } }, owner],
      failure: [{ request_range: { key: b(key) } }, owner],
    });
    const rev = res.succeeded
      ? String(res.header.revision)
      : String(res.responses[0].response_range!.kvs[0].create_revision);
    for (;;) {
      const older = await this.#raw.kv.range({
        ...owner.request_range,
        max_create_revision: String(BigInt(rev) - 1n),
      });
      if (older.kvs.length === 0) return { key, rev };
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  async #unlock(mutex: Mutex): Promise<void> {
    await this.#raw.kv.deleteRange({ key: b(mutex.key) });
  }

  /** Stops renewing and revokes the node's leases (its references and mutexes vanish). */
  async close(): Promise<void> {
    for (const lease of this.#leases) await lease.revoke().catch(() => {});
  }

  /** Same as {@linkcode CiliumDouble.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function owns(mutex: Mutex): ICompare {
  return { key: b(mutex.key), target: "Create", result: "Equal", create_revision: mutex.rev };
}

function readPrefix(prefix: string): IRequestOp {
  return { request_range: { key: b(prefix), range_end: Buffer.from(prefixEnd(b(prefix))) } };
}

function firstId(prefix: string, kvs: IKeyValue[]): number {
  for (const kv of kvs) {
    if (!prefixMatchesKey(prefix, text(kv.key))) continue;
    const id = parseId(text(kv.value));
    if (id !== undefined) return id;
  }
  return 0;
}

/** Advances `steps` until it yielded `step` (throws if it ends first). */
export async function runUntil<S, R>(steps: AsyncGenerator<S, R>, step: S): Promise<void> {
  for (;;) {
    const next = await steps.next();
    if (next.done) throw new Error(`the double finished before step '${String(step)}'`);
    if (next.value === step) return;
  }
}

/** Runs `steps` to its end and returns its result. */
export async function finish<S, R>(steps: AsyncGenerator<S, R>): Promise<R> {
  for (;;) {
    const next = await steps.next();
    if (next.done) return next.value;
  }
}
