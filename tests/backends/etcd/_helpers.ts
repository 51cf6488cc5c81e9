/**
 * Helpers of the etcd backend tests: an isolated namespace on the shared private etcd (or a
 * given cluster), sessions with short leases, deterministic candidate pickers.
 */
import assert from "node:assert/strict";
import type { Etcd3 } from "etcd3";
import type {
  BackendEvent,
  BackendSession,
  SessionOptions,
} from "../../../src/allocator/backend.ts";
import { EtcdBackend, type EtcdBackendOptions } from "../../../src/backends/etcd/mod.ts";
import { EtcdLayout } from "../../../src/backends/etcd/layout.ts";
import { nodesPrefix } from "../../../src/backends/etcd/presence.ts";
import { type EtcdCluster, etcdUnavailable } from "../../../src/backends/etcd/testing/cluster.ts";
import { dump, rawClient, sharedEtcd } from "../../../src/backends/etcd/testing/fixture.ts";

export { eventually } from "../../_support/eventually.ts";

/** Registers an etcd test; skipped (loudly) when etcd is missing, unless CI is set. */
export function etcdTest(name: string, fn: (t: Deno.TestContext) => Promise<void>): void {
  Deno.test({ name, ignore: etcdUnavailable() !== undefined, fn });
}

/** Picks the first of `ids` not excluded (a deterministic stand-in for the allocator's pool). */
export function picker(...ids: number[]): (exclude: ReadonlySet<number>) => number | undefined {
  return (exclude) => ids.find((id) => !exclude.has(id));
}

/** A generous deadline for one call in a test. */
export function deadline(ms = 10_000): AbortSignal {
  return AbortSignal.timeout(ms);
}

/** An isolated prefix on a private etcd, with a raw client; disposing deletes the prefix. */
export interface Namespace extends AsyncDisposable {
  readonly endpoints: readonly string[];
  readonly prefix: string;
  readonly layout: EtcdLayout;
  /** Raw etcd3 client (for writing fixtures and reading the store directly). */
  readonly raw: Etcd3;
  /** A backend for `node` on this prefix (closed with the namespace). */
  backend(node: string, options?: Partial<EtcdBackendOptions>): Promise<EtcdBackend>;
  /**
   * Every key-value under the prefix but the sessions' presence keys (`<prefix>/nodes/<node>`, see
   * `src/backends/etcd/presence.ts`): masters, references, locks and whatever a test planted.
   */
  dump(): Promise<Array<{ key: string; value: string; lease: string; mod: string }>>;
  /** The sessions' presence keys alone. */
  nodes(): Promise<Array<{ key: string; value: string; lease: string; mod: string }>>;
}

/** Opens a namespace on `cluster` (default: the shared private etcd) under `prefix`. */
export async function namespace(
  cluster?: EtcdCluster,
  prefix = `t/${crypto.randomUUID()}/cilium/state/identities/v1`,
): Promise<Namespace> {
  const etcd = cluster ?? await sharedEtcd();
  const endpoints = etcd.endpoints;
  const raw = rawClient(endpoints);
  const backends: EtcdBackend[] = [];
  return {
    endpoints,
    prefix,
    layout: new EtcdLayout(prefix),
    raw,
    async backend(node, options = {}) {
      const b = await EtcdBackend.connect({ endpoints: [...endpoints], prefix, node, ...options });
      backends.push(b);
      return b;
    },
    dump: async () => {
      const nodes = nodesPrefix(new EtcdLayout(prefix));
      return (await dump(raw, prefix + "/")).filter((kv) => !kv.key.startsWith(nodes));
    },
    nodes: () => dump(raw, nodesPrefix(new EtcdLayout(prefix))),
    async [Symbol.asyncDispose]() {
      await Promise.allSettled(backends.map((b) => b.close()));
      try {
        await raw.delete().prefix(prefix + "/").catch(() => {});
      } finally {
        raw.close();
      }
    },
  };
}

/** Opens a writable session with a 2 s lease. */
export function openSession(
  backend: EtcdBackend,
  options: Partial<SessionOptions> = {},
): Promise<BackendSession> {
  return backend.openSession({
    leaseTtlMs: 2_000,
    readOnly: false,
    onLeaseReplaced: () => {},
    ...options,
  });
}

/** Node "a" (backend and session) on a fresh namespace, with a deadline for the test's calls. */
export interface OneNode extends AsyncDisposable {
  readonly ns: Namespace;
  readonly a: EtcdBackend;
  readonly sa: BackendSession;
  readonly signal: AbortSignal;
}

/** Nodes "a" and "c" (backends and sessions) on a fresh namespace. */
export interface TwoNodes extends OneNode {
  readonly c: EtcdBackend;
  readonly sc: BackendSession;
}

/** Opens node "a", its session with {@linkcode openSession}`(a, options)`; disposal: sa, ns. */
export async function oneNode(options: Partial<SessionOptions> = {}): Promise<OneNode> {
  await using stack = new AsyncDisposableStack();
  const ns = stack.use(await namespace());
  const a = await ns.backend("a");
  const sa = stack.use(await openSession(a, options));
  const owned = stack.move();
  return { ns, a, sa, signal: deadline(), [Symbol.asyncDispose]: () => owned.disposeAsync() };
}

/** Opens nodes "a" and "c", each with a 2 s-lease session; disposal: sc, sa, ns. */
export async function twoNodes(): Promise<TwoNodes> {
  await using stack = new AsyncDisposableStack();
  const ns = stack.use(await namespace());
  const a = await ns.backend("a");
  const c = await ns.backend("c");
  const sa = stack.use(await openSession(a));
  const sc = stack.use(await openSession(c));
  const owned = stack.move();
  return {
    ns,
    a,
    c,
    sa,
    sc,
    signal: deadline(),
    [Symbol.asyncDispose]: () => owned.disposeAsync(),
  };
}

/**
 * Runs `fn` with a lease `raw` grants for `ttlSeconds` (to write references as another writer
 * would), revoking it afterwards.
 */
export async function withLease<T>(
  raw: Etcd3,
  ttlSeconds: number,
  fn: (lease: string) => Promise<T>,
): Promise<T> {
  const lease = String((await raw.leaseClient.leaseGrant({ TTL: ttlSeconds })).ID);
  try {
    return await fn(lease);
  } finally {
    await raw.leaseClient.leaseRevoke({ ID: lease });
  }
}

/** Requests of operation `op` (default: `acquire` transactions) `backend` sent while `fn` ran. */
export async function requestsDuring<T>(
  backend: EtcdBackend,
  fn: () => Promise<T>,
  op = "acquire",
): Promise<{ result: T; requests: number }> {
  const before = backend.requestStats().operations[op] ?? 0;
  const result = await fn();
  return { result, requests: (backend.requestStats().operations[op] ?? 0) - before };
}

/** Events without their opaque versions, for comparisons. */
export function plain(events: readonly BackendEvent[]): Array<Record<string, unknown>> {
  return events.map((e) => {
    if (e.type === "upsert") return { type: e.type, id: e.id, key: e.key };
    if (e.type === "delete") return { type: e.type, id: e.id };
    return { ...e };
  });
}

/** Collects a session's watch events until (and including) the first `synced`. */
export async function listUntilSynced(
  session: BackendSession,
  signal: AbortSignal,
): Promise<BackendEvent[]> {
  const out: BackendEvent[] = [];
  for await (const ev of session.watch(signal)) {
    out.push(ev);
    if (ev.type === "synced") break;
  }
  return out;
}

/** What the store says, read directly: masters by ID, and the IDs each key's references name. */
export interface StoreView {
  readonly masters: ReadonlyMap<number, string>;
  readonly refIds: ReadonlyMap<string, ReadonlySet<number>>;
}

/** Reads every master and reference under the namespace. */
export async function storeView(ns: Namespace): Promise<StoreView> {
  const masters = new Map<number, string>();
  const refIds = new Map<string, Set<number>>();
  for (const kv of await ns.dump()) {
    const id = ns.layout.idOfMasterKey(kv.key);
    if (id !== undefined) masters.set(id, kv.value);
    const ref = ns.layout.splitRefKey(kv.key);
    if (ref) refIds.set(ref.key, (refIds.get(ref.key) ?? new Set()).add(Number(kv.value)));
  }
  return { masters, refIds };
}

/**
 * Asserts the invariants from the store itself: every referenced key's references name one ID,
 * whose master names the key, and — unless `staleMasters` (unreferenced masters waiting for GC
 * are expected) — no key has a second master. Returns key → ID.
 */
export async function assertOneIdPerKey(
  ns: Namespace,
  { staleMasters = false } = {},
): Promise<Map<string, number>> {
  const { masters, refIds } = await storeView(ns);
  const ids = new Map<string, number>();
  for (const [key, set] of refIds) {
    assert.equal(set.size, 1, `${key} has references to ${[...set].join(", ")}`);
    const [id] = set;
    assert.equal(masters.get(id), key, `master of ${id} names ${key}`);
    ids.set(key, id);
  }
  if (staleMasters) return ids;
  const byKey = new Map<string, number[]>();
  for (const [id, key] of masters) byKey.set(key, [...byKey.get(key) ?? [], id]);
  for (const [key, list] of byKey) {
    assert.equal(list.length, 1, `${key} has masters ${list.join(", ")}`);
  }
  return ids;
}
