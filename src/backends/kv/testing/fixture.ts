/**
 * The Deno KV {@linkcode BackendFactory}: every fixture is a fresh KV file in its own temp dir,
 * removed on dispose. Each `backend()` opens its own `Deno.Kv` handle on that file, as a separate
 * node would; the fixture closes them all.
 *
 * Timing knobs: `fast` → poll 20 ms, clock skew 50 ms, resync 1 s; otherwise poll 100 ms, skew
 * 250 ms, resync 5 s. Lease TTLs given to the allocator must be at least twice the skew.
 *
 * @example
 * ```ts ignore
 * // ignored: writes a temporary KV file; the shared suites run it (tests/conformance/).
 * await using store = await kvFactory.create();
 * const backend = await store.backend("node-a", { fast: true });
 * ```
 * @module
 */
import type { Backend } from "../../../allocator/backend.ts";
import { DenoKvBackend, type DenoKvBackendOptions } from "../mod.ts";
import { KvLayout } from "../layout.ts";
import { isLive, type LeaseRecord } from "../liveness.ts";
import { decode } from "../schema.ts";
import { kvUnavailable, openKvFile } from "./open.ts";
import type { KvU64Class } from "../options.ts";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type {
  BackendFactory,
  FixtureOptions,
  NodeBackendOptions,
  OpenFromSpec,
  StoredReference,
  StoreFixture,
  StoreSpec,
} from "../../../testing/fixture.ts";

/** The prefix every KV fixture uses (the file is fresh, so any prefix isolates). */
export const KV_FIXTURE_PREFIX: readonly string[] = ["idalloc", "test"];

/** Timing knobs of fixture backends. */
export function kvTimings(
  options?: NodeBackendOptions,
): Pick<DenoKvBackendOptions, "pollIntervalMs" | "maxClockSkewMs" | "resyncIntervalMs"> {
  return options?.fast
    ? { pollIntervalMs: 20, maxClockSkewMs: 50, resyncIntervalMs: 1_000 }
    : { pollIntervalMs: 100, maxClockSkewMs: 250, resyncIntervalMs: 5_000 };
}

/** Opens a node's backend on the KV file a spec names (in a child process). */
export const openFromSpec: OpenFromSpec = async (
  spec: StoreSpec,
  node: string,
  options?: NodeBackendOptions,
): Promise<{ backend: Backend } & AsyncDisposable> => {
  const { path, prefix, groupCommit } = spec.store as {
    path: string;
    prefix: string[];
    groupCommit: boolean;
  };
  const { kv, kvU64 } = await openKvFile(path);
  const backend = new DenoKvBackend(kv, {
    prefix,
    node,
    groupCommit,
    kvU64,
    ...kvTimings(options),
  });
  return {
    backend,
    [Symbol.asyncDispose]: () => Promise.resolve(kv.close()),
  };
};

/** Makes fresh KV-file fixtures. */
export const kvFactory: BackendFactory = {
  kind: "deno-kv",
  get unavailable(): string | undefined {
    return kvUnavailable();
  },
  traits: {
    counters: true,
    groupCommit: true,
    holdersUnmark: false,
    minLeaseTtlMs: 1_000,
    // A dead node's references stay until GC sweeps them: liveness is read from lease records.
    deadReferencesStay: true,
    plantedDamageKinds: ["counter-wrong-type", "index-undecodable", "log-undecodable"],
    repairedByRemoval: ['["idalloc", "test", "gen"]'],
  },
  create: (options) => KvStoreFixture.create(options),
  openFromSpec,
};

/** One fresh KV file. */
export class KvStoreFixture implements StoreFixture {
  readonly kind: string = "deno-kv";
  /** The KV file. */
  readonly path: string;
  /** The fixture's own handle, for direct reads and damage. */
  readonly kv: Deno.Kv;
  /** The layout under {@linkcode KV_FIXTURE_PREFIX}. */
  readonly layout: KvLayout = new KvLayout(KV_FIXTURE_PREFIX);
  readonly #dir: string;
  readonly #groupCommit: boolean;
  readonly #handles: Deno.Kv[] = [];
  readonly #kvU64: KvU64Class | undefined;
  /** Skew margin per node, to judge liveness as the node's own backend does. */
  readonly #skew = new Map<string, number>();

  private constructor(
    dir: string,
    kv: Deno.Kv,
    kvU64: KvU64Class | undefined,
    options: FixtureOptions,
  ) {
    this.#dir = dir;
    this.#kvU64 = kvU64;
    this.#groupCommit = options.groupCommit ?? true;
    this.path = `${dir}/ids.kv`;
    this.kv = kv;
  }

  /** Creates the temp dir and the KV file. */
  static async create(options: FixtureOptions = {}): Promise<KvStoreFixture> {
    const dir = await mkdtemp(join(tmpdir(), "idalloc-kv-"));
    const { kv, kvU64 } = await openKvFile(`${dir}/ids.kv`);
    return new KvStoreFixture(dir, kv, kvU64, options);
  }

  async backend(node: string, options?: NodeBackendOptions): Promise<DenoKvBackend> {
    const { kv } = await openKvFile(this.path);
    this.#handles.push(kv);
    const timings = kvTimings(options);
    this.#skew.set(node, timings.maxClockSkewMs!);
    return new DenoKvBackend(kv, {
      prefix: KV_FIXTURE_PREFIX,
      node,
      groupCommit: this.#groupCommit,
      kvU64: this.#kvU64,
      ...timings,
    });
  }

  spec(): StoreSpec {
    return {
      kind: "deno-kv",
      store: { path: this.path, prefix: [...KV_FIXTURE_PREFIX], groupCommit: this.#groupCommit },
      cli: [
        "--store",
        `kv:${this.path}`,
        "--prefix",
        KV_FIXTURE_PREFIX.join("/"),
        "--poll",
        "50ms",
        "--clock-skew",
        "100ms",
      ],
    };
  }

  async masters(): Promise<Map<number, string>> {
    const out = new Map<number, string>();
    for await (const entry of this.kv.list({ prefix: this.layout.ids() })) {
      const id = this.layout.parseId(entry.key);
      const value = id === undefined ? undefined : decode.master(entry);
      if (id !== undefined && value !== undefined) out.set(id, value.key);
    }
    return out;
  }

  async references(): Promise<StoredReference[]> {
    const refs: { key: string; node: string; id: number; lease: string }[] = [];
    for await (const entry of this.kv.list({ prefix: this.layout.refs() })) {
      const parsed = this.layout.parseRef(entry.key);
      const value = parsed === undefined ? undefined : decode.ref(entry);
      if (parsed !== undefined && value !== undefined) refs.push({ ...parsed, ...value });
    }
    const nodes = [...new Set(refs.map((r) => r.node))];
    const leases = new Map<string, LeaseRecord>();
    for (const node of nodes) {
      const entry = await this.kv.get(this.layout.lease(node));
      leases.set(node, {
        value: entry.versionstamp === null
          ? undefined
          : decode.lease(entry as Deno.KvEntry<unknown>),
        versionstamp: entry.versionstamp,
      });
    }
    const now = Date.now();
    return refs.map(({ key, node, id, lease }) => ({
      key,
      node,
      id,
      live: isLive({ id, lease }, leases.get(node), now, this.#skew.get(node) ?? 250),
    }));
  }

  async plantReference(key: string, node: string, id: number): Promise<void> {
    // A live lease of the node's own (kept if it has one), and a reference under it.
    const leaseKey = this.layout.lease(node);
    const current = await this.kv.get(leaseKey);
    let lease = current.versionstamp === null
      ? undefined
      : decode.lease(current as Deno.KvEntry<unknown>);
    if (lease === undefined || lease.expiresAt < Date.now() + 60_000) {
      lease = { lease: lease?.lease ?? `planted-${node}`, expiresAt: Date.now() + 600_000 };
      await this.kv.set(leaseKey, lease);
    }
    await this.kv.set(this.layout.ref(key, node), { id, lease: lease.lease });
  }

  async plantCorruptReference(key: string, node: string): Promise<void> {
    await this.kv.set(this.layout.ref(key, node), "not a reference");
  }

  async plantCorruptEntries(): Promise<void> {
    const P = KV_FIXTURE_PREFIX;
    await this.kv.atomic()
      .set([...P, "id", "not-a-number"], { key: "corrupt-a" }) // non-numeric ID
      .set([...P, "id", 9_999], "not an object") // master with a bad value
      .set([...P, "id", 12, "extra"], { key: "corrupt-b" }) // wrong key shape
      .set([...P, "key", "corrupt-index"], { id: "seven" }) // bad key index
      .set([...P, "ref", "corrupt-key", "ghost"], 42) // bad reference
      .set([...P, "log", Date.now(), "ghost", "x"], "garbage") // bad change-feed entry
      .commit();
  }

  async plantOversizedMaster(id: number): Promise<void> {
    await this.kv.set(this.layout.id(id), { key: "k".repeat(60_000) });
  }

  async corruptMaster(id: number): Promise<void> {
    await this.kv.set(this.layout.id(id), "garbage");
  }

  async corruptCounter(counter: "gen" | { readonly touch: string }): Promise<void> {
    const key = counter === "gen" ? this.layout.gen() : this.layout.touch(counter.touch);
    await this.kv.set(key, "x");
  }

  /** Deletes master `id` and its key index (the pair is the master in this layout), unlogged. */
  async deleteMaster(id: number): Promise<void> {
    const master = await this.kv.get(this.layout.id(id));
    const op = this.kv.atomic().delete(this.layout.id(id));
    const key = master.versionstamp === null
      ? undefined
      : decode.master(master as Deno.KvEntry<unknown>)?.key;
    if (key !== undefined) {
      const index = await this.kv.get(this.layout.key(key));
      if (
        index.versionstamp !== null &&
        decode.keyIndex(index as Deno.KvEntry<unknown>)?.id === id
      ) {
        op.delete(this.layout.key(key));
      }
    }
    await op.commit();
  }

  async deleteReference(key: string, node: string): Promise<void> {
    await this.kv.delete(this.layout.ref(key, node));
  }

  async dropLease(node: string): Promise<void> {
    await this.kv.delete(this.layout.lease(node));
  }

  async rewriteMaster(id: number, key: string): Promise<void> {
    const master = await this.kv.get(this.layout.id(id));
    const old = master.versionstamp === null
      ? undefined
      : decode.master(master as Deno.KvEntry<unknown>)?.key;
    const op = this.kv.atomic();
    if (old !== undefined) op.delete(this.layout.key(old));
    await op.set(this.layout.id(id), { key }).set(this.layout.key(key), { id })
      .set(this.layout.log(Date.now(), "fixture", crypto.randomUUID()), { id, key }, {
        expireIn: 600_000,
      })
      .sum(this.layout.gen(), 1n)
      .commit();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    for (const kv of [...this.#handles.splice(0), this.kv]) closeQuietly(kv);
    await rm(this.#dir, { recursive: true, force: true });
  }
}

function closeQuietly(kv: Deno.Kv): void {
  try {
    kv.close();
  } catch {
    // already closed by the test
  }
}
