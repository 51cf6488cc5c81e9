/**
 * etcd's nemesis hooks: every fault (its members can be killed, compacted and cut off), Cilium
 * nodes beside the workers, and its store — a prefix on the run's private 3-member cluster, read
 * through Cilium's layout as the backend parses it. A reference without a lease is not live
 * (Cilium always writes references with the node's lease; a lease-less one is garbage that never
 * expires).
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { Etcd3, IKeyValue } from "../../../deps/etcd3.ts";
import { z } from "../../../deps/zod.ts";
import { EtcdBackend } from "../mod.ts";
import { EtcdLayout, parseId } from "../layout.ts";
import { type EtcdCluster, startEtcd } from "./cluster.ts";
import { rawClient } from "./fixture.ts";
import { recordEtcdChanges } from "./store_changes.ts";
import type {
  SnapshotMaster,
  SnapshotRef,
  StoreSnapshot,
} from "../../../../nemesis/checks/store.ts";
import type { GrowthSample } from "../../../../nemesis/growth_worker.ts";
import type { StoreSpec } from "../../../../nemesis/records.ts";
import {
  GARBAGE_KINDS,
  garbageId,
  garbageKey,
  type GarbageKind,
  type GarbageTargets,
  type NemesisHooks,
  type NemesisRunStore,
  type NemesisStore,
  type OpenedBackend,
  type Planted,
} from "../../../../nemesis/stores/store.ts";

/** How a nemesis process reaches an etcd store. */
const etcdSpecSchema = z.object({
  kind: z.literal("etcd"),
  endpoints: z.array(z.string()).min(1),
  prefix: z.string().min(1),
  requestTimeoutMs: z.number().int().positive(),
});

/** How a nemesis process reaches an etcd store. */
export type EtcdNemesisSpec = z.infer<typeof etcdSpecSchema>;

/** The workers' etcd request timeout. */
const REQUEST_TIMEOUT_MS = 3_000;

/** The etcd prefix of every process of a run, Cilium nodes' included. */
const RUN_PREFIX = "nemesis/state/identities/v1";

/** Garbage an etcd store can hold: its layout has no key index and no counters. */
const ETCD_GARBAGE: readonly GarbageKind[] = GARBAGE_KINDS.filter((k) =>
  k !== "bad-index" && k !== "bad-counter"
);

/** A master value just under etcd's default 1.5 MiB request limit. */
const OVERSIZED_CHARS = 1_000_000;

const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

function utf8(bytes: Uint8Array): string | undefined {
  try {
    return strictUtf8.decode(bytes);
  } catch {
    return undefined;
  }
}

let planted = 0;

/** The store `spec` names: a prefix on an etcd cluster. */
export function openEtcdStore(spec: EtcdNemesisSpec): NemesisStore {
  return new EtcdNemesisStore(spec);
}

/** An entry as the report shows it: bytes spelled out, a long value cut short. */
function show(key: string | Buffer, value: string | Buffer): string {
  const k = typeof key === "string" ? key : `bytes:${[...key]}`;
  const v = typeof value === "string"
    ? (value.length > 80 ? `${value.slice(0, 40)}…(${value.length} chars)` : JSON.stringify(value))
    : `bytes:${[...value]}`;
  return `${k} = ${v}`;
}

/** A run's etcd store, read and damaged through Cilium's layout; with its cluster when it owns one. */
class EtcdNemesisStore implements NemesisRunStore {
  readonly kind = "etcd";
  readonly spec: EtcdNemesisSpec;
  readonly garbageKinds: readonly GarbageKind[] = ETCD_GARBAGE;
  readonly skewMs = 0;
  readonly members?: EtcdCluster;
  readonly cilium?: { readonly endpoints: readonly string[]; readonly prefix: string };
  readonly #raw: Etcd3;
  readonly #layout: EtcdLayout;

  /** The store `spec` names; a `cluster` given is the store's own, stopped when it is disposed. */
  constructor(spec: EtcdNemesisSpec, cluster?: EtcdCluster) {
    this.spec = spec;
    this.members = cluster;
    this.cilium = cluster ? { endpoints: cluster.endpoints, prefix: spec.prefix } : undefined;
    // The checks read the whole prefix at once; a long run plants many ~1 MB garbage values (30
    // minutes: ~7 MB), past gRPC's default 4 MiB receive limit.
    this.#raw = rawClient(spec.endpoints, { maxReceiveBytes: 256 * 1024 * 1024 });
    this.#layout = new EtcdLayout(spec.prefix);
  }

  async #all(): Promise<IKeyValue[]> {
    return (await this.#raw.getAll().prefix(this.spec.prefix + "/").exec()).kvs;
  }

  /** Puts `value` at `key` only if the key does not exist; true if it wrote. */
  async #create(key: string | Buffer, value: string | Buffer): Promise<boolean> {
    const res = await this.#raw.if(key, "Create", "==", 0).then(this.#raw.put(key).value(value))
      .commit();
    return res.succeeded;
  }

  recordChanges(path: string): Promise<AsyncDisposable> {
    return recordEtcdChanges(this.spec.endpoints, this.spec.prefix, path);
  }

  async snapshot(): Promise<StoreSnapshot> {
    const masters: SnapshotMaster[] = [];
    const refs: SnapshotRef[] = [];
    const skipped: Record<string, number> = {};
    const skip = (what: string) => (skipped[what] = (skipped[what] ?? 0) + 1);
    for (const kv of await this.#all()) {
      const key = utf8(kv.key);
      if (key === undefined) {
        skip("invalid UTF-8 key");
        continue;
      }
      if (key.startsWith(this.#layout.masterRange)) {
        const id = this.#layout.idOfMasterKey(key);
        const value = utf8(kv.value);
        if (id === undefined) skip("non-numeric ID");
        else if (value === undefined) skip("invalid UTF-8 master");
        else if (value === "") skip("empty master");
        else masters.push({ id, key: value });
        continue;
      }
      const parts = this.#layout.splitRefKey(key);
      if (parts) {
        const id = parseId(utf8(kv.value) ?? "");
        if (id === undefined) skip("bad reference value");
        // etcd deletes a lease's keys when it ends: a reference with a lease is live.
        else refs.push({ ...parts, id, live: String(kv.lease) !== "0" });
        continue;
      }
      skip("foreign");
    }
    return { at: Date.now(), masters, refs, strictMasters: false, skipped };
  }

  async plant(kind: GarbageKind, targets: GarbageTargets): Promise<Planted> {
    const tag = `nemesis-ghost-${++planted}`;
    const written: string[] = [];
    const masterIds: number[] = [];
    const put = async (key: string | Buffer, value: string | Buffer) => {
      await this.#raw.put(key).value(value);
      written.push(show(key, value));
    };
    const somewhere = async (value: string | Buffer): Promise<number | undefined> => {
      for (let i = 0; i < 20; i++) {
        const id = garbageId(targets);
        const key = this.#layout.masterKey(id);
        if (await this.#create(key, value)) {
          written.push(show(key, value));
          return id;
        }
      }
    };
    switch (kind) {
      case "non-numeric-id":
        await put(`${this.#layout.masterRange}${tag}`, garbageKey(targets));
        break;
      case "empty-master":
        await somewhere("");
        break;
      case "bad-ref":
        await put(this.#layout.refKey(garbageKey(targets), tag), "not-an-id");
        break;
      case "invalid-utf8":
        await somewhere(Buffer.from([0xff, 0xfe, 0x80]));
        await put(
          Buffer.concat([
            Buffer.from(`${this.#layout.valuePrefix}/`),
            Buffer.from([0xc3, 0x28]),
            Buffer.from(`/${tag}`),
          ]),
          "300",
        );
        break;
      case "oversized": {
        const id = await somewhere(`k8s:nemesis-oversized=${"x".repeat(OVERSIZED_CHARS)};`);
        if (id !== undefined) masterIds.push(id);
        break;
      }
      case "orphan-ref":
        // A numeric reference without a lease: it never expires and names an ID that may be
        // another key's.
        await put(this.#layout.refKey(garbageKey(targets), tag), String(garbageId(targets)));
        break;
      default:
        throw new Error(`garbage kind ${kind} does not exist on etcd`);
    }
    return { kind, entries: written, masterIds };
  }

  async revokeLease(node: string): Promise<string> {
    const leases = new Set<string>();
    for (const kv of await this.#all()) {
      const key = utf8(kv.key);
      const parts = key === undefined ? undefined : this.#layout.splitRefKey(key);
      if (parts?.node === node && String(kv.lease) !== "0") leases.add(String(kv.lease));
    }
    for (const id of leases) await this.#raw.leaseClient.leaseRevoke({ ID: id });
    return leases.size === 0
      ? `${node} had no reference, so no lease to revoke`
      : `revoked ${node}'s lease(s) ${[...leases].join(", ")}`;
  }

  async counts(): Promise<Record<string, number>> {
    const out: Record<string, number> = {};
    const inc = (what: string) => (out[what] = (out[what] ?? 0) + 1);
    for (const kv of await this.#all()) {
      const key = utf8(kv.key) ?? "";
      if (key.startsWith(this.#layout.masterRange)) inc("id");
      else if (this.#layout.splitRefKey(key)) {
        inc(String(kv.lease) === "0" ? "value (no lease)" : "value");
      } else inc("other");
    }
    out["leases"] = (await this.#raw.leaseClient.leaseLeases()).leases.length;
    return out;
  }

  fileBytes(): Promise<number> {
    return Promise.resolve(0);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      this.#raw.close();
    } finally {
      await this.members?.close();
    }
  }
}

/** `spec` as this backend's; throws a `ZodError` when it is another's or malformed. */
function etcdSpec(spec: StoreSpec): EtcdNemesisSpec {
  return etcdSpecSchema.parse(spec);
}

/** A run's store: a private 3-member cluster, stopped with the store. */
async function startRun(): Promise<NemesisRunStore> {
  const etcd = await startEtcd({ members: 3 });
  return new EtcdNemesisStore({
    kind: "etcd",
    endpoints: [...etcd.endpoints],
    prefix: RUN_PREFIX,
    requestTimeoutMs: REQUEST_TIMEOUT_MS,
  }, etcd);
}

async function openBackend(spec: StoreSpec, node: string): Promise<OpenedBackend> {
  const { endpoints, prefix, requestTimeoutMs } = etcdSpec(spec);
  const backend = await EtcdBackend.connect({ endpoints, prefix, node, requestTimeoutMs });
  return { backend, [Symbol.asyncDispose]: () => backend.close() };
}

/**
 * etcd's growth bounds: the window bounds references, none is without a lease, one node keeps at
 * most two leases.
 */
function checkGrowth(
  s: GrowthSample,
  { window }: { readonly keys: number; readonly window: number },
  fail: (what: string) => void,
): void {
  const c = (name: string) => s.counts[name] ?? 0;
  if (c("value") > 2 * window) fail(`${c("value")} references for ${window} held keys`);
  if (c("value (no lease)") > 0) fail(`${c("value (no lease)")} references without a lease`);
  if (c("leases") > 2) fail(`${c("leases")} etcd leases for one node`);
}

/** etcd's nemesis hooks. */
export const etcdNemesis: NemesisHooks = {
  faults: [
    "kill",
    "stall",
    "lease-revoke",
    "garbage",
    "compact",
    "kill-follower",
    "kill-leader",
    "outage",
  ],
  garbageKinds: ETCD_GARBAGE,
  // Measured on a busy 2-core machine with 4 workers around a short fault phase: about 19 s with
  // three members (a store fault still in progress when the phase ends adds to it).
  overhead: { fixed: 18, share: 0.02 },
  cilium: true,
  timings: (_name, timings) => timings,
  startRun,
  async startGrowth() {
    // One member is enough here: the run measures idalloc's growth, not raft's.
    const etcd = await startEtcd({ members: 1 });
    const spec: EtcdNemesisSpec = {
      kind: "etcd",
      endpoints: [...etcd.endpoints],
      prefix: "growth",
      requestTimeoutMs: REQUEST_TIMEOUT_MS,
    };
    return { spec, [Symbol.asyncDispose]: () => etcd.close() };
  },
  openStore: (spec) => Promise.resolve(openEtcdStore(etcdSpec(spec))),
  openBackend,
  growth: {
    check: checkGrowth,
    columns: ["masters", "refs", "leases"],
    row(s: GrowthSample): string[] {
      const c = (name: string) => String(s.counts[name] ?? 0);
      return [c("id"), c("value"), c("leases")];
    },
  },
};
