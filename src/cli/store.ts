/**
 * Opening the store named by `--store`/`--prefix` for one CLI run, and the few questions an
 * operator asks that the allocator API does not answer: is anything stored under this prefix, which
 * other prefixes does the store hold, which nodes hold a lease.
 *
 * Those answers read the documented Deno KV layout (see `@idalloc/idalloc/kv`) directly and only
 * read, except {@linkcode Store.deleteReference}. The etcd backend is loaded only when
 * `--store etcd://…` is used, so KV commands do not pay for the gRPC client.
 *
 * @module
 */
import { z } from "zod";
import type { Backend, BackendSession } from "../allocator/backend.ts";
import { DenoKvBackend } from "../backends/kv/mod.ts";
import { InvalidOptionsError, StoreUnavailableError } from "../errors.ts";
import { formatKvPrefix, type GlobalOptions, kvPrefix } from "./args.ts";

/** A node's lease as the store holds it (Deno KV only). */
export interface NodeLease {
  /** The node's name. */
  readonly node: string;
  /** When the lease ends (ms since the epoch, the node's own clock). */
  readonly expiresAt: number;
  /** Whether it is still live (with the clock-skew margin). */
  readonly live: boolean;
}

/** The store of one run. Close it after every allocator opened on its backend. */
export interface Store {
  /** `deno-kv` or `etcd`. */
  readonly kind: string;
  /** The store, for messages: `deno-kv ./ids.kv`, `etcd http://127.0.0.1:2379`. */
  readonly where: string;
  /** The prefix as the user types it. */
  readonly prefix: string;
  /** The backend, with this run's node name. */
  readonly backend: Backend;
  /** Whether anything was ever stored under the prefix. */
  namespaceExists(signal: AbortSignal): Promise<boolean>;
  /** Other prefixes in use in this store (Deno KV; empty for etcd), for hints. */
  otherNamespaces(signal: AbortSignal): Promise<string[]>;
  /** A read-only session (no lease, no writes), closed with the store. */
  reader(signal: AbortSignal): Promise<BackendSession>;
  /**
   * Deletes `node`'s reference to the encoded `key`, without taking that node's lease. Returns
   * whether a reference existed, or `undefined` when the backend cannot tell.
   */
  deleteReference(key: string, node: string, signal: AbortSignal): Promise<boolean | undefined>;
  /** Every node lease record under the prefix (Deno KV), or `undefined` (etcd). */
  nodeLeases(signal: AbortSignal): Promise<NodeLease[] | undefined>;
  /** Closes sessions and the connection (etcd) or the Kv handle. */
  close(): Promise<void>;
}

/** Options of {@linkcode openStore}. */
export interface OpenStoreOptions {
  /** Create a new Deno KV file if none exists (only for commands that allocate). */
  readonly create: boolean;
  /** Aborts connecting. */
  readonly signal: AbortSignal;
}

/** Opens the store of `options`; throws `InvalidOptionsError` or `StoreUnavailableError`. */
export async function openStore(options: GlobalOptions, open: OpenStoreOptions): Promise<Store> {
  return options.store.kind === "deno-kv"
    ? await KvStore.open(options, options.store.path, open)
    : await openEtcd(options, options.store.hosts, open);
}

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

const leaseValue = z.object({ lease: z.string(), expiresAt: z.number() });

/** Parts that end a namespace's key in the KV layout, for spotting other prefixes. */
function namespaceOf(key: Deno.KvKey): Deno.KvKey | undefined {
  const n = key.length;
  if (n >= 2 && key[n - 1] === "gen") return key.slice(0, n - 1);
  if (n >= 3 && key[n - 2] === "id" && typeof key[n - 1] === "number") return key.slice(0, n - 2);
  if (n >= 3 && key[n - 2] === "lease" && typeof key[n - 1] === "string") {
    return key.slice(0, n - 2);
  }
  return undefined;
}

/** Entries read per step when looking for other prefixes, and steps at most. */
const SCAN_BATCH = 200;
const SCAN_STEPS = 25;

class KvStore implements Store {
  readonly kind = "deno-kv";
  readonly where: string;
  readonly prefix: string;
  readonly backend: Backend;
  readonly #kv: Deno.Kv;
  readonly #parts: (string | number)[];
  readonly #skewMs: number;
  readonly #sessions: BackendSession[] = [];

  private constructor(kv: Deno.Kv, path: string, parts: (string | number)[], o: GlobalOptions) {
    this.#kv = kv;
    this.#parts = parts;
    this.#skewMs = o.clockSkewMs;
    this.where = `deno-kv ${path}`;
    this.prefix = formatKvPrefix(parts);
    this.backend = new DenoKvBackend(kv, {
      prefix: parts,
      node: o.node,
      pollIntervalMs: o.pollMs,
      maxClockSkewMs: o.clockSkewMs,
      // The feed keeps at least two poll windows of history; keep the default unless polls are slow.
      logRetentionMs: Math.max(600_000, 2 * (o.pollMs + o.clockSkewMs)),
    });
  }

  static async open(o: GlobalOptions, path: string, open: OpenStoreOptions): Promise<KvStore> {
    const parts = kvPrefix(o.prefix);
    const remote = /^https?:\/\//.test(path);
    if (!open.create && !remote && path !== ":memory:") {
      try {
        await Deno.stat(path);
      } catch (err) {
        if (err instanceof Deno.errors.NotFound) {
          throw new InvalidOptionsError(
            `no Deno KV store at ${path}: nothing was allocated there yet, or --store is wrong`,
          );
        }
        throw new StoreUnavailableError(`cannot open Deno KV store ${path}: ${errorText(err)}`, {
          cause: err,
        });
      }
    }
    let kv: Deno.Kv;
    try {
      kv = await Deno.openKv(path);
    } catch (err) {
      throw new StoreUnavailableError(`cannot open Deno KV store ${path}: ${errorText(err)}`, {
        cause: err,
      });
    }
    try {
      const store = new KvStore(kv, path, parts, o);
      // A file that is not a KV store opens fine and fails on the first read: fail here instead.
      await kv.get([...parts, "gen"]);
      return store;
    } catch (err) {
      kv.close();
      if (err instanceof InvalidOptionsError) throw err;
      throw new StoreUnavailableError(`cannot read Deno KV store ${path}: ${errorText(err)}`, {
        cause: err,
      });
    }
  }

  async namespaceExists(_signal: AbortSignal): Promise<boolean> {
    const p = this.#parts;
    if ((await this.#kv.get([...p, "gen"])).versionstamp !== null) return true;
    for (const part of ["id", "lease", "ref"]) {
      for await (const _ of this.#kv.list({ prefix: [...p, part] }, { limit: 1 })) return true;
    }
    return false;
  }

  async otherNamespaces(signal: AbortSignal): Promise<string[]> {
    const found = new Map<string, Deno.KvKey>();
    // A skip scan: find a key that reveals a namespace, then jump past that namespace.
    let selector: Deno.KvListSelector = { prefix: [] };
    for (let step = 0; step < SCAN_STEPS && !signal.aborted; step++) {
      let last: Deno.KvKey | undefined;
      let next: Deno.KvListSelector | undefined;
      for await (const entry of this.#kv.list(selector, { limit: SCAN_BATCH })) {
        last = entry.key;
        const ns = namespaceOf(entry.key);
        if (ns) {
          found.set(JSON.stringify(ns), ns);
          // `true` sorts after every string and number part: the end of this namespace.
          next = { start: [...ns, true], end: [true] };
          break;
        }
      }
      if (last === undefined) break;
      selector = next ?? { start: [...last, new Uint8Array(0)], end: [true] };
    }
    const own = JSON.stringify(this.#parts);
    return [...found.entries()].filter(([k]) => k !== own).map(([, ns]) => formatKvPrefix(ns));
  }

  async reader(signal: AbortSignal): Promise<BackendSession> {
    const session = await this.backend.openSession({
      leaseTtlMs: 60_000,
      readOnly: true,
      onLeaseReplaced: () => {},
      signal,
    });
    this.#sessions.push(session);
    return session;
  }

  async deleteReference(key: string, node: string): Promise<boolean> {
    // The documented layout: `[...prefix, "ref", key, node]`. Deleting it directly takes no lease
    // in `node`'s name (a session would write a new lease record and so kill the node's others).
    const ref = [...this.#parts, "ref", key, node];
    for (;;) {
      const entry = await this.#kv.get(ref);
      if (entry.versionstamp === null) return false;
      const res = await this.#kv.atomic().check(entry).delete(ref).commit();
      if (res.ok) return true;
    }
  }

  async nodeLeases(): Promise<NodeLease[]> {
    const out: NodeLease[] = [];
    const now = Date.now();
    for await (const entry of this.#kv.list({ prefix: [...this.#parts, "lease"] })) {
      const node = entry.key[entry.key.length - 1];
      const value = leaseValue.safeParse(entry.value);
      if (typeof node !== "string" || !value.success) continue;
      const { expiresAt } = value.data;
      out.push({ node, expiresAt, live: expiresAt + this.#skewMs > now });
    }
    return out;
  }

  async close(): Promise<void> {
    await Promise.allSettled(this.#sessions.map((s) => s.close()));
    this.#kv.close();
  }
}

async function readPem(flag: string, path: string | undefined): Promise<string | undefined> {
  if (path === undefined) return undefined;
  try {
    return await Deno.readTextFile(path);
  } catch (err) {
    throw new InvalidOptionsError(`cannot read ${flag} file ${path}: ${errorText(err)}`, {
      cause: err,
    });
  }
}

async function openEtcd(
  o: GlobalOptions,
  hosts: readonly string[],
  open: OpenStoreOptions,
): Promise<Store> {
  const { EtcdBackend, CILIUM_IDENTITIES_PREFIX } = await import("../backends/etcd/mod.ts");
  const scheme = o.ca !== undefined ? "https" : "http";
  const endpoints = hosts.map((h) => `${scheme}://${h}`);
  const ca = await readPem("--ca", o.ca);
  const tls = ca === undefined ? undefined : {
    ca,
    cert: await readPem("--cert", o.cert),
    key: await readPem("--key", o.key),
    serverName: o.tlsServerName,
  };
  if (ca === undefined && (o.cert !== undefined || o.tlsServerName !== undefined)) {
    throw new InvalidOptionsError("invalid option: --cert/--key/--tls-server-name need --ca");
  }
  const prefix = o.prefix ?? CILIUM_IDENTITIES_PREFIX;
  const connect = (node: string) =>
    EtcdBackend.connect({
      endpoints,
      prefix,
      node,
      tls,
      user: o.user,
      password: o.password,
      dialTimeoutMs: o.connectTimeoutMs,
      requestTimeoutMs: Math.min(o.connectTimeoutMs, o.timeoutMs),
    }, { signal: open.signal });
  const backend = await connect(o.node);
  const sessions: BackendSession[] = [];
  const reader = async (signal: AbortSignal): Promise<BackendSession> => {
    const session = await backend.openSession({
      leaseTtlMs: 60_000,
      readOnly: true,
      onLeaseReplaced: () => {},
      signal,
    });
    sessions.push(session);
    return session;
  };
  return {
    kind: "etcd",
    where: `etcd ${endpoints.join(",")}`,
    prefix,
    backend,
    async namespaceExists(signal: AbortSignal): Promise<boolean> {
      const session = await reader(signal);
      for await (const _ of session.gcList({ min: 0, max: Number.MAX_SAFE_INTEGER }, signal)) {
        return true;
      }
      return false;
    },
    otherNamespaces: () => Promise.resolve([]),
    reader,
    async deleteReference(key: string, node: string, signal: AbortSignal) {
      // The session deletes `<prefix>/value/<key>/<node>` of its backend's node; its own lease is
      // a fresh one and does not touch the leases of the running node of that name.
      await using other = await connect(node);
      const session = await other.openSession({
        leaseTtlMs: 10_000,
        readOnly: false,
        onLeaseReplaced: () => {},
        signal,
      });
      try {
        await session.release(key, 0, signal);
      } finally {
        await session.close();
      }
      return undefined;
    },
    nodeLeases: () => Promise.resolve(undefined),
    async close(): Promise<void> {
      await Promise.allSettled(sessions.map((s) => s.close()));
      await backend.close();
    },
  };
}
