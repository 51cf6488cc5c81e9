/**
 * etcd's nemesis hooks: every fault of the nemesis's own, faults of its store (its members killed,
 * compacted and cut off), Cilium nodes beside the workers, and its store — a prefix on the run's
 * private 3-member cluster, read through Cilium's layout as the backend parses it. A reference
 * without a lease is not live (Cilium always writes references with the node's lease; a lease-less
 * one is garbage that never expires).
 *
 * @module
 */
import { Buffer } from "node:buffer";
import { sleep } from "../../../abort.ts";
import type { Etcd3, IKeyValue } from "../../../deps/etcd3.ts";
import { z } from "../../../deps/zod.ts";
import {
  type GarbageTargets,
  type GrowthSample,
  NEMESIS_FAULTS,
  type NemesisHooks,
  type NemesisRunStore,
  type NemesisStore,
  type NemesisStoreSpec,
  type OpenedBackend,
  OVERSIZED_KEY_PREFIX,
  type Planted,
  type SnapshotMaster,
  type SnapshotRef,
  type StoreFaultOutcome,
  type StoreSnapshot,
} from "../../../testing/nemesis.ts";
import { between } from "../../../testing/prng.ts";
import type { StoreChange } from "../../../testing/store_changes.ts";
import { EtcdBackend } from "../mod.ts";
import { EtcdLayout, parseId } from "../layout.ts";
import { type EtcdCluster, startEtcd } from "./cluster.ts";
import { rawClient } from "./fixture.ts";
import { recordEtcdChanges } from "./store_changes.ts";

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
const ETCD_GARBAGE = [
  "non-numeric-id",
  "empty-master",
  "bad-ref",
  "invalid-utf8",
  "oversized",
  "orphan-ref",
] as const;

/** One kind of garbage of an etcd store. */
type EtcdGarbage = typeof ETCD_GARBAGE[number];

/** The faults of a run's cluster, each with the report's label. */
const STORE_FAULTS = {
  "compact": "compaction",
  "kill-follower": "kill etcd follower",
  "kill-leader": "kill etcd leader",
  "outage": "etcd outage",
} as const;

/** One fault of a run's cluster. */
type EtcdStoreFault = keyof typeof STORE_FAULTS;

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
  readonly skewMs = 0;
  readonly cilium?: { readonly endpoints: readonly string[]; readonly prefix: string };
  readonly #cluster?: EtcdCluster;
  readonly #raw: Etcd3;
  readonly #layout: EtcdLayout;

  /** The store `spec` names; a `cluster` given is the store's own, stopped when it is disposed. */
  constructor(spec: EtcdNemesisSpec, cluster?: EtcdCluster) {
    this.spec = spec;
    this.#cluster = cluster;
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

  recordChanges(record: (change: StoreChange) => void): Promise<AsyncDisposable> {
    return recordEtcdChanges(this.spec.endpoints, this.spec.prefix, record);
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

  async plant(kind: string, targets: GarbageTargets): Promise<Planted> {
    const tag = `nemesis-ghost-${++planted}`;
    const written: string[] = [];
    const masterIds: number[] = [];
    const put = async (key: string | Buffer, value: string | Buffer) => {
      await this.#raw.put(key).value(value);
      written.push(show(key, value));
    };
    const somewhere = async (value: string | Buffer): Promise<number | undefined> => {
      for (let i = 0; i < 20; i++) {
        const id = targets.id();
        const key = this.#layout.masterKey(id);
        if (await this.#create(key, value)) {
          written.push(show(key, value));
          return id;
        }
      }
    };
    switch (kind as EtcdGarbage) {
      case "non-numeric-id":
        await put(`${this.#layout.masterRange}${tag}`, targets.key());
        break;
      case "empty-master":
        await somewhere("");
        break;
      case "bad-ref":
        await put(this.#layout.refKey(targets.key(), tag), "not-an-id");
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
        const id = await somewhere(`${OVERSIZED_KEY_PREFIX}${"x".repeat(OVERSIZED_CHARS)};`);
        if (id !== undefined) masterIds.push(id);
        break;
      }
      case "orphan-ref":
        // A numeric reference without a lease: it never expires and names an ID that may be
        // another key's.
        await put(this.#layout.refKey(targets.key(), tag), String(targets.id()));
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

  async injectFault(kind: string, random: () => number): Promise<StoreFaultOutcome> {
    const cluster = this.#cluster;
    if (cluster === undefined) throw new Error(`${kind}: the store has no cluster of its own`);
    return await injectClusterFault(cluster, kind as EtcdStoreFault, random);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      this.#raw.close();
    } finally {
      await this.#cluster?.close();
    }
  }
}

/** Injects fault `kind` on a run's `cluster` and waits until every member is healthy again. */
async function injectClusterFault(
  cluster: EtcdCluster,
  kind: EtcdStoreFault,
  random: () => number,
): Promise<StoreFaultOutcome> {
  const members = cluster.endpoints.map((_, i) => i);
  switch (kind) {
    case "compact": {
      // A watch only meets a compacted revision when it resumes from an older one: break the
      // streams of one member's clients first, compact while they reconnect.
      const member = Math.floor(random() * members.length);
      const withKill = random() < 0.5;
      if (withKill) await cluster.kill(member);
      const revision = await retry(() => cluster.compact());
      if (!withKill) return { detail: `compacted at revision ${revision}` };
      await sleep(between(random, 300, 1_500));
      await cluster.restart(member);
      return {
        detail: `compacted at revision ${revision} while member ${member} was down`,
        backAt: Date.now(),
      };
    }
    case "kill-follower":
    case "kill-leader": {
      const leader = await cluster.leader();
      const followers = members.filter((i) => i !== leader);
      const victim = kind === "kill-leader"
        ? leader
        : followers[Math.floor(random() * followers.length)];
      const down = between(random, 1_000, 4_000);
      await cluster.kill(victim);
      await sleep(down);
      await cluster.restart(victim);
      return {
        detail: `SIGKILL member ${victim}${
          kind === "kill-leader" ? " (leader)" : ""
        }, down ${down} ms`,
        backAt: Date.now(),
      };
    }
    case "outage": {
      const down = between(random, 2_000, 6_000);
      await Promise.all(members.map((i) => cluster.kill(i)));
      await sleep(down);
      // Started together: one member alone has no quorum and never turns healthy.
      await Promise.all(members.map((i) => cluster.restart(i)));
      return { detail: `every member down for ${down} ms`, backAt: Date.now() };
    }
    default:
      throw new Error(`no store fault '${kind}' on etcd`);
  }
}

/** Runs `fn`, retrying a few times: etcd refuses requests for a moment after a leader change. */
async function retry<T>(fn: () => Promise<T>, attempts = 10): Promise<T> {
  for (let i = 1;; i++) {
    try {
      return await fn();
    } catch (err) {
      if (i >= attempts) throw err;
      await sleep(500);
    }
  }
}

/** `spec` as this backend's; throws a `ZodError` when it is another's or malformed. */
function etcdSpec(spec: NemesisStoreSpec): EtcdNemesisSpec {
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

async function openBackend(spec: NemesisStoreSpec, node: string): Promise<OpenedBackend> {
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
  faults: NEMESIS_FAULTS,
  storeFaults: STORE_FAULTS,
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
