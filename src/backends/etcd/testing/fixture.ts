/**
 * The etcd `BackendFactory` for the conformance suite: one private etcd per test process (started
 * on first use, stopped at exit), a fresh random prefix per fixture.
 *
 * @example
 * ```ts ignore
 * // ignored: starts a private etcd; the shared suites run it (tests/conformance/).
 * await using fx = await etcdFactory.create();
 * const backend = await fx.backend("node-a");
 * console.log(await fx.masters());
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import process from "node:process";
import { Etcd3, type Lease } from "../../../deps/etcd3.ts";
import type { Backend } from "../../../allocator/backend.ts";
import { EtcdBackend } from "../mod.ts";
import { EtcdLayout, parseId } from "../layout.ts";
import { envEtcd, type EtcdCluster, etcdUnavailable, startEtcd } from "./cluster.ts";
import type {
  BackendFactory,
  FixtureOptions,
  NodeBackendOptions,
  OpenFromSpec,
  StoredReference,
  StoreFixture,
  StoreSpec,
} from "../../../testing/fixture.ts";

let shared: Promise<EtcdCluster> | undefined;

/**
 * The etcd every fixture of this process uses: the test run's shared one when the test launcher
 * names it (`IDALLOC_ETCD_TEST_SERVER`: `deno task test` does), else a private one (one member)
 * started on first call and stopped when the process exits. Tests that kill or restart members
 * start their own with `startEtcd`.
 */
export function sharedEtcd(): Promise<EtcdCluster> {
  const attached = shared === undefined ? envEtcd() : undefined;
  if (attached !== undefined) shared = Promise.resolve(attached);
  shared ??= startEtcd().then((cluster) => {
    process.on("exit", () => cluster.stopSync());
    return cluster;
  });
  return shared;
}

/** A raw etcd3 client for direct reads and writes in tests. Close it with `close()`. */
export function rawClient(
  endpoints: readonly string[],
  options: { readonly maxReceiveBytes?: number } = {},
): Etcd3 {
  return new Etcd3({
    hosts: [...endpoints],
    grpcOptions: {
      "grpc.use_local_subchannel_pool": 1,
      // grpc-js leaves a dead member's reconnect-backoff timer running after close(); keep it
      // too short to outlive a test.
      "grpc.initial_reconnect_backoff_ms": 1,
      "grpc.max_reconnect_backoff_ms": 1,
      ...(options.maxReceiveBytes === undefined
        ? {}
        : { "grpc.max_receive_message_length": options.maxReceiveBytes }),
    },
  });
}

/** UTF-8 bytes. */
export function b(s: string): Buffer {
  return Buffer.from(s, "utf8");
}

/** Every key-value under `prefix`, as strings, sorted by key. */
export async function dump(
  client: Etcd3,
  prefix: string,
): Promise<Array<{ key: string; value: string; lease: string; mod: string }>> {
  const res = await client.getAll().prefix(prefix).exec();
  return res.kvs.map((kv) => ({
    key: kv.key.toString(),
    value: kv.value.toString(),
    lease: String(kv.lease),
    mod: String(kv.mod_revision),
  }));
}

/** Opens a node's etcd backend on the store a spec names (in a child process). */
export const openFromSpec: OpenFromSpec = async (
  spec: StoreSpec,
  node: string,
): Promise<{ backend: Backend } & AsyncDisposable> => {
  const { endpoints, prefix, groupCommit } = spec.store as {
    endpoints: string[];
    prefix: string;
    groupCommit: boolean;
  };
  const backend = await EtcdBackend.connect({ endpoints, prefix, node, groupCommit });
  return { backend, [Symbol.asyncDispose]: () => backend.close() };
};

class EtcdStoreFixture implements StoreFixture {
  readonly kind = "etcd";
  readonly #endpoints: readonly string[];
  readonly #prefix: string;
  readonly #layout: EtcdLayout;
  readonly #raw: Etcd3;
  readonly #backends: EtcdBackend[] = [];
  readonly #planted: Lease[] = [];
  readonly #groupCommit: boolean;

  constructor(endpoints: readonly string[], prefix: string, options: FixtureOptions = {}) {
    this.#groupCommit = options.groupCommit ?? true;
    this.#endpoints = endpoints;
    this.#prefix = prefix;
    this.#layout = new EtcdLayout(prefix);
    this.#raw = rawClient(endpoints);
  }

  async backend(node: string, _options?: NodeBackendOptions): Promise<Backend> {
    const backend = await EtcdBackend.connect({
      endpoints: [...this.#endpoints],
      prefix: this.#prefix,
      node,
      requestTimeoutMs: 5_000,
      groupCommit: this.#groupCommit,
    });
    this.#backends.push(backend);
    return backend;
  }

  spec(): StoreSpec {
    const hosts = this.#endpoints.map((e) => e.replace(/^https?:\/\//, "")).join(",");
    return {
      kind: "etcd",
      store: {
        endpoints: [...this.#endpoints],
        prefix: this.#prefix,
        groupCommit: this.#groupCommit,
      },
      cli: ["--store", `etcd://${hosts}`, "--prefix", this.#prefix],
    };
  }

  async masters(): Promise<Map<number, string>> {
    const out = new Map<number, string>();
    for (const kv of await dump(this.#raw, this.#layout.masterRange)) {
      const id = this.#layout.idOfMasterKey(kv.key);
      if (id !== undefined && kv.value !== "") out.set(id, kv.value);
    }
    return out;
  }

  async references(): Promise<StoredReference[]> {
    const out: StoredReference[] = [];
    for (const kv of await dump(this.#raw, this.#layout.valuePrefix + "/")) {
      const parts = this.#layout.splitRefKey(kv.key);
      const id = parseId(kv.value);
      if (!parts || id === undefined) continue;
      // etcd deletes a lease's keys when it expires: a stored reference is a live one.
      out.push({ key: parts.key, node: parts.node, id, live: true });
    }
    return out;
  }

  async plantReference(key: string, node: string, id: number): Promise<void> {
    // On a lease of its own, like a node's reference (etcd keeps it while the lease lives).
    const lease = this.#raw.lease(600, { autoKeepAlive: false });
    await lease.put(this.#layout.refKey(key, node)).value(String(id));
    this.#planted.push(lease);
  }

  async plantCorruptReference(key: string, node: string): Promise<void> {
    const refs = await dump(this.#raw, this.#layout.valuePrefix + "/");
    const lease = refs.find((kv) => kv.key.endsWith(`/${node}`) && kv.lease !== "0")?.lease;
    if (lease === undefined) throw new Error(`node ${node} has no reference on a lease`);
    await this.#raw.kv.put({
      key: Buffer.from(this.#layout.refKey(key, node)),
      value: b("not-an-id"),
      lease,
    });
  }

  async plantCorruptEntries(): Promise<void> {
    await this.#raw.put(`${this.#layout.masterRange}not-a-number`).value("k8s:corrupt=1;");
    await this.#raw.put(this.#layout.masterKey(987_654)).value("");
    await this.#raw.put(this.#layout.refKey("k8s:corrupt=2;", "node-x")).value("not-an-id");
  }

  async plantOversizedMaster(id: number): Promise<void> {
    await this.#raw.put(this.#layout.masterKey(id)).value("k".repeat(1_400_000));
  }

  async corruptMaster(id: number): Promise<void> {
    await this.#raw.put(this.#layout.masterKey(id)).value(Buffer.from([0xff, 0xfe, 0x00, 0x80]));
  }

  async deleteMaster(id: number): Promise<void> {
    await this.#raw.delete().key(this.#layout.masterKey(id));
  }

  async deleteReference(key: string, node: string): Promise<void> {
    await this.#raw.delete().key(this.#layout.refKey(key, node));
  }

  async dropLease(node: string): Promise<void> {
    const refs = await dump(this.#raw, this.#layout.valuePrefix + "/");
    const leases = new Set(refs.filter((kv) => kv.key.endsWith(`/${node}`)).map((kv) => kv.lease));
    for (const lease of leases) await this.#raw.leaseClient.leaseRevoke({ ID: lease });
  }

  async rewriteMaster(id: number, key: string): Promise<void> {
    await this.#raw.put(this.#layout.masterKey(id)).value(key);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Promise.allSettled(this.#backends.map((b) => b.close()));
    await Promise.allSettled(this.#planted.map((l) => l.revoke()));
    try {
      await this.#raw.delete().prefix(this.#prefix + "/");
    } finally {
      this.#raw.close();
    }
  }
}

/** The etcd factory of the conformance suite. */
export const etcdFactory: BackendFactory = {
  kind: "etcd",
  traits: {
    counters: false,
    groupCommit: true,
    holdersUnmark: false,
    holdersRepairAtOnce: false,
    // etcd grants leases of whole seconds, at least 2.
    minLeaseTtlMs: 2_000,
    // etcd deletes a lease's keys with it.
    deadReferencesStay: false,
    plantedDamageKinds: [],
    repairedByRemoval: [],
  },
  get unavailable(): string | undefined {
    return etcdUnavailable();
  },
  async create(options?: FixtureOptions): Promise<StoreFixture> {
    const etcd = await sharedEtcd();
    return new EtcdStoreFixture(etcd.endpoints, `idalloc-test/${crypto.randomUUID()}`, options);
  },
  openFromSpec,
};
