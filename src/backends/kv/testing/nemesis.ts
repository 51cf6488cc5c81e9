/**
 * Deno KV's nemesis hooks: the faults it supports (no store members), its timings, and its store
 * — a fresh file in the run's directory, read through the backend's own layout and decoders, so
 * an entry counts as data exactly when the backend would accept it.
 *
 * @module
 */
import { z } from "../../../deps/zod.ts";
import { DenoKvBackend } from "../mod.ts";
import { KvLayout } from "../layout.ts";
import { isLive, type LeaseRecord } from "../liveness.ts";
import { decode } from "../schema.ts";
import {
  type GarbageTargets,
  type GrowthSample,
  NEMESIS_FAULTS,
  type NemesisHooks,
  type NemesisStore,
  type NemesisStoreSpec,
  type NemesisTimings,
  type NemesisWorkload,
  type OpenBackendExtra,
  type OpenedBackend,
  OVERSIZED_KEY_PREFIX,
  type Planted,
  type SnapshotMaster,
  type SnapshotRef,
  type StoreSnapshot,
} from "../../../testing/nemesis.ts";

/** How a nemesis process reaches a Deno KV store: the file, the prefix, the backends' timings. */
const kvSpecSchema = z.object({
  kind: z.literal("deno-kv"),
  path: z.string().min(1),
  prefix: z.array(z.string()).min(1),
  pollIntervalMs: z.number().int().positive(),
  maxClockSkewMs: z.number().int().nonnegative(),
  resyncIntervalMs: z.number().int().positive(),
});

/** How a nemesis process reaches a Deno KV store. */
export type KvNemesisSpec = z.infer<typeof kvSpecSchema>;

/** Timings of the workers' KV backends. */
export type KvTimings = Pick<
  KvNemesisSpec,
  "pollIntervalMs" | "maxClockSkewMs" | "resyncIntervalMs"
>;

/** The workers' timings under `workload`: its clock slack, polls every 200 ms. */
export function kvTimings(workload: Pick<NemesisWorkload, "clockSkewMs">): KvTimings {
  return { pollIntervalMs: 200, maxClockSkewMs: workload.clockSkewMs, resyncIntervalMs: 15_000 };
}

/** The growth run's timings: the default workload's. */
const GROWTH_TIMINGS: KvTimings = kvTimings({ clockSkewMs: 500 });

/**
 * Garbage a Deno KV store can hold: every entry of its layout can be damaged, key index and
 * counters included.
 */
const KV_GARBAGE = [
  "non-numeric-id",
  "empty-master",
  "bad-ref",
  "invalid-utf8",
  "oversized",
  "orphan-ref",
  "bad-index",
  "bad-counter",
] as const;

/** One kind of garbage of a Deno KV store. */
type KvGarbage = typeof KV_GARBAGE[number];

/** The value size that stays just under Deno KV's 64 KiB limit. */
const OVERSIZED_CHARS = 60_000;

let planted = 0;

/** Opens (creating) the KV file `spec` names as the run's store. */
export async function openKvStore(spec: KvNemesisSpec): Promise<NemesisStore> {
  return new KvNemesisStore(spec, await Deno.openKv(spec.path));
}

/** An entry as the report shows it: its key (bytes spelled out) and a short form of its value. */
function show(key: Deno.KvKey, value: unknown): string {
  return `${JSON.stringify(key.map((p) => p instanceof Uint8Array ? `bytes:${[...p]}` : p))} = ${
    describe(value)
  }`;
}

/** The run's Deno KV store, read and damaged through the backend's own layout. */
class KvNemesisStore implements NemesisStore {
  readonly kind = "deno-kv";
  readonly spec: KvNemesisSpec;
  readonly skewMs: number;
  readonly #kv: Deno.Kv;
  readonly #layout: KvLayout;
  readonly #prefix: Deno.KvKeyPart[];

  constructor(spec: KvNemesisSpec, kv: Deno.Kv) {
    this.spec = spec;
    this.skewMs = spec.maxClockSkewMs;
    this.#kv = kv;
    this.#layout = new KvLayout(spec.prefix);
    this.#prefix = [...spec.prefix];
  }

  #all(): Promise<Deno.KvEntry<unknown>[]> {
    return whenNotBusy(async () => {
      const out: Deno.KvEntry<unknown>[] = [];
      for await (const e of this.#kv.list({ prefix: this.#prefix }, { batchSize: 500 })) {
        out.push(e);
      }
      return out;
    });
  }

  /** Writes `value` at `key` only if nothing is there; true if it wrote. */
  async #create(key: Deno.KvKey, value: unknown): Promise<boolean> {
    const res = await whenNotBusy(() =>
      this.#kv.atomic().check({ key, versionstamp: null }).set(key, value).commit()
    );
    return res.ok;
  }

  /** Creates at the first of a few candidate keys that is free. */
  async #createSomewhere(
    candidates: () => Deno.KvKey,
    value: unknown,
    attempts = 20,
  ): Promise<Deno.KvKey | undefined> {
    for (let i = 0; i < attempts; i++) {
      const key = candidates();
      if (await this.#create(key, value)) return key;
    }
    return undefined;
  }

  async snapshot(): Promise<StoreSnapshot> {
    const entries = await this.#all();
    const masters: SnapshotMaster[] = [];
    const index: { key: string; id: number }[] = [];
    const rawRefs: { key: string; node: string; id: number; lease: string }[] = [];
    const leases = new Map<string, LeaseRecord>();
    const skipped: Record<string, number> = {};
    const skip = (what: string) => (skipped[what] = (skipped[what] ?? 0) + 1);
    const n = this.#prefix.length;
    for (const e of entries) {
      switch (e.key[n]) {
        case "id": {
          const id = this.#layout.parseId(e.key);
          const value = id === undefined ? undefined : decode.master(e);
          if (id === undefined || value === undefined) skip("master");
          else masters.push({ id, key: value.key });
          break;
        }
        case "key": {
          const key = e.key[n + 1];
          const value = e.key.length === n + 2 && typeof key === "string"
            ? decode.keyIndex(e)
            : undefined;
          if (value === undefined || typeof key !== "string") skip("key index");
          else index.push({ key, id: value.id });
          break;
        }
        case "ref": {
          const parsed = this.#layout.parseRef(e.key);
          const value = parsed === undefined ? undefined : decode.ref(e);
          if (parsed === undefined || value === undefined) skip("reference");
          else rawRefs.push({ ...parsed, ...value });
          break;
        }
        case "lease": {
          const node = this.#layout.parseLease(e.key);
          if (node === undefined) skip("lease");
          else leases.set(node, { value: decode.lease(e), versionstamp: e.versionstamp });
          break;
        }
        case "touch":
        case "log":
        case "gen":
          break;
        default:
          skip("foreign");
      }
    }
    const now = Date.now();
    const refs: SnapshotRef[] = rawRefs.map((r) => ({
      key: r.key,
      node: r.node,
      id: r.id,
      live: isLive({ id: r.id, lease: r.lease }, leases.get(r.node), now, this.skewMs),
    }));
    return { at: now, masters, refs, index, strictMasters: true, skipped };
  }

  async plant(kind: string, targets: GarbageTargets): Promise<Planted> {
    const tag = `nemesis-ghost-${++planted}`;
    const written: string[] = [];
    const masterIds: number[] = [];
    const put = async (key: Deno.KvKey, value: unknown) => {
      if (await this.#create(key, value)) written.push(show(key, value));
    };
    const somewhere = async (candidates: () => Deno.KvKey, value: unknown) => {
      const key = await this.#createSomewhere(candidates, value);
      if (key) written.push(show(key, value));
    };
    switch (kind as KvGarbage) {
      case "non-numeric-id":
        await put([...this.#prefix, "id", tag], { key: targets.key() });
        break;
      case "empty-master":
        await somewhere(() => [...this.#prefix, "id", targets.id()], { key: "" });
        await somewhere(() => [...this.#prefix, "id", targets.id()], {});
        break;
      case "bad-ref":
        await put([...this.#prefix, "ref", targets.key(), tag], { id: "seven", lease: 42 });
        break;
      case "invalid-utf8":
        await somewhere(() => [...this.#prefix, "id", targets.id()], {
          key: new Uint8Array([0xff, 0xfe, 0x80]),
        });
        await put([...this.#prefix, "id", new Uint8Array([0xc3, 0x28, planted & 0xff])], {
          key: "x;",
        });
        await put([...this.#prefix, "ref", new Uint8Array([0xe2, 0x28, 0xa1]), tag], {
          id: 300,
          lease: "x",
        });
        break;
      case "oversized": {
        const key = await this.#createSomewhere(() => [...this.#prefix, "id", targets.id()], {
          key: `${OVERSIZED_KEY_PREFIX}${"x".repeat(OVERSIZED_CHARS)};`,
        });
        if (key) {
          written.push(show(key, { key: `k8s:nemesis-oversized=x…;` }));
          masterIds.push(key[this.#prefix.length + 1] as number);
        }
        break;
      }
      case "orphan-ref":
        // A reference naming an ID under a lease nobody holds: dead from the start.
        await put([...this.#prefix, "ref", targets.key(), tag], {
          id: targets.id(),
          lease: tag,
        });
        break;
      case "bad-index":
        // Only where the key has no index: an existing index is valid data.
        await somewhere(() => [...this.#prefix, "key", targets.key()], { id: "seven" });
        break;
      case "bad-counter":
        await somewhere(() => [...this.#prefix, "touch", targets.key()], "not a counter");
        break;
      default:
        throw new Error(`garbage kind ${kind} does not exist on Deno KV`);
    }
    return { kind, entries: written, masterIds };
  }

  async revokeLease(node: string): Promise<string> {
    const key = this.#layout.lease(node);
    const entry = await whenNotBusy(() => this.#kv.get(key));
    await whenNotBusy(() => this.#kv.delete(key));
    return entry.versionstamp === null
      ? `${node} had no lease record`
      : `deleted ${node}'s lease record ${describe(entry.value)}`;
  }

  async counts(): Promise<Record<string, number>> {
    const snapshot = await this.snapshot();
    const out: Record<string, number> = {};
    const n = this.#prefix.length;
    for (const e of await this.#all()) {
      const part = String(e.key[n]);
      out[part] = (out[part] ?? 0) + 1;
    }
    out["ref (dead)"] = snapshot.refs.filter((r) => !r.live).length;
    // Every commit that writes change-feed entries adds their number to `gen` in the same
    // commit: its value is how many entries were ever written.
    const gen = (await this.#kv.get(this.#layout.gen())).value;
    out["feed written"] = gen instanceof Deno.KvU64 ? Number(gen.value) : 0;
    return out;
  }

  async fileBytes(): Promise<number> {
    let n = 0;
    for (const suffix of ["", "-wal"]) {
      n += await Deno.stat(this.spec.path + suffix).then((s) => s.size, () => 0);
    }
    return n;
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.#kv.close();
    return Promise.resolve();
  }
}

/**
 * Runs `fn`, retrying while SQLite reports the file busy: the workers write the same file from
 * their own processes all the time.
 */
async function whenNotBusy<T>(fn: () => Promise<T>): Promise<T> {
  for (let attempt = 0;; attempt++) {
    try {
      return await fn();
    } catch (err) {
      if (attempt >= 200 || !/database is (locked|busy)/i.test(String(err))) throw err;
      await new Promise((r) => setTimeout(r, 5 + Math.random() * 20));
    }
  }
}

function describe(value: unknown): string {
  const text = JSON.stringify(
    value,
    (_k, v) => v instanceof Uint8Array ? `bytes:${[...v]}` : typeof v === "bigint" ? String(v) : v,
  );
  return text.length > 120 ? `${text.slice(0, 60)}…(${text.length} chars)` : text;
}

/** `spec` as this backend's; throws a `ZodError` when it is another's or malformed. */
function kvSpec(spec: NemesisStoreSpec): KvNemesisSpec {
  return kvSpecSchema.parse(spec);
}

async function openBackend(
  spec: NemesisStoreSpec,
  node: string,
  extra: OpenBackendExtra = {},
): Promise<OpenedBackend> {
  const { path, prefix, pollIntervalMs, maxClockSkewMs, resyncIntervalMs } = kvSpec(spec);
  const kv = await Deno.openKv(path);
  const backend = new DenoKvBackend(kv, {
    prefix,
    node,
    pollIntervalMs,
    maxClockSkewMs,
    resyncIntervalMs,
    ...extra,
  });
  return { backend, [Symbol.asyncDispose]: () => Promise.resolve(kv.close()) };
}

const MiB = 1024 * 1024;

function mib(bytes: number): string {
  return (bytes / MiB).toFixed(1);
}

/**
 * Deno KV's growth bounds: the key set bounds key state (index, touch counters), the window
 * bounds references, one node keeps at most two lease records, and the change feed holds no more
 * than the entries written in its retention window.
 */
function checkGrowth(
  s: GrowthSample,
  { keys, window }: { readonly keys: number; readonly window: number },
  fail: (what: string) => void,
): void {
  const c = (name: string) => s.counts[name] ?? 0;
  if (c("key") > keys) fail(`${c("key")} key index entries for ${keys} keys`);
  if (c("touch") > keys) fail(`${c("touch")} touch counters for ${keys} keys`);
  if (c("ref") > 2 * window) fail(`${c("ref")} references for ${window} held keys`);
  if (c("ref (dead)") > window) fail(`${c("ref (dead)")} dead references`);
  if (c("lease") > 2) fail(`${c("lease")} lease records for one node`);
  if (c("log") > s.recentChanges + 64) {
    fail(
      `${
        c("log")
      } change-feed entries, but only ${s.recentChanges} written in the last ${s.logWindowMs} ms`,
    );
  }
}

/** Deno KV's nemesis hooks. */
export const kvNemesis: NemesisHooks = {
  // A single file has no members to kill, compact or cut off: no store faults of its own.
  faults: NEMESIS_FAULTS,
  garbageKinds: KV_GARBAGE,
  // Measured on a busy 2-core machine with 4 workers around a short fault phase: 10–11 s.
  overhead: { fixed: 10, share: 0.02 },
  cilium: false,
  timings(name: string, timings: NemesisTimings): NemesisTimings {
    // The key-side workload's shape on Deno KV (see nemesis/workload.ts): leases of 1.5 s.
    return name === "keyside" ? { ...timings, leaseTtlMs: 1_500 } : timings;
  },
  startRun: (dir, workload) =>
    openKvStore({
      kind: "deno-kv",
      path: `${dir}/store.kv`,
      prefix: ["nemesis"],
      ...kvTimings(workload),
    }),
  startGrowth(dir) {
    const spec: KvNemesisSpec = {
      kind: "deno-kv",
      path: `${dir}/growth.kv`,
      prefix: ["growth"],
      ...GROWTH_TIMINGS,
    };
    // The file stays in the run's directory with the other evidence.
    return Promise.resolve({ spec, [Symbol.asyncDispose]: () => Promise.resolve() });
  },
  openStore: (spec) => openKvStore(kvSpec(spec)),
  openBackend,
  growth: {
    check: checkGrowth,
    columns: ["file MiB", "masters", "refs", "dead refs", "leases", "feed", "feed bound"],
    row(s: GrowthSample): string[] {
      const c = (name: string) => String(s.counts[name] ?? 0);
      return [
        mib(s.fileBytes),
        c("id"),
        c("ref"),
        c("ref (dead)"),
        c("lease"),
        c("log"),
        String(s.recentChanges + 64),
      ];
    },
  },
};
