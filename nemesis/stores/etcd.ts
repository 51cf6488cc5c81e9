/**
 * The etcd store of a nemesis run: a prefix on the run's private 3-member cluster, read through
 * Cilium's layout as the backend parses it. A reference without a lease is not live (Cilium
 * always writes references with the node's lease; a lease-less one is garbage that never expires).
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { Etcd3, IKeyValue } from "etcd3";
import { EtcdLayout, parseId } from "../../src/backends/etcd/layout.ts";
import { rawClient } from "../../tests/_support/etcd_fixture.ts";
import type { SnapshotMaster, SnapshotRef, StoreSnapshot } from "../checks/store.ts";
import type { StoreSpec } from "../records.ts";
import {
  GARBAGE_KINDS,
  garbageId,
  garbageKey,
  type GarbageKind,
  type GarbageTargets,
  KV_ONLY_GARBAGE,
  type NemesisStore,
  type Planted,
} from "./store.ts";

/** Garbage an etcd store can hold. */
const ETCD_GARBAGE: readonly GarbageKind[] = GARBAGE_KINDS.filter((k) => !KV_ONLY_GARBAGE.has(k));

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

/** The run's store on `endpoints` under `prefix`. */
export function openEtcdStore(
  endpoints: readonly string[],
  prefix: string,
  requestTimeoutMs: number,
): NemesisStore {
  // The checks read the whole prefix at once; a long run plants many ~1 MB garbage values (30
  // minutes: ~7 MB), past gRPC's default 4 MiB receive limit.
  const raw: Etcd3 = rawClient(endpoints, { maxReceiveBytes: 256 * 1024 * 1024 });
  const layout = new EtcdLayout(prefix);
  const spec: StoreSpec = { kind: "etcd", endpoints: [...endpoints], prefix, requestTimeoutMs };

  async function all(): Promise<IKeyValue[]> {
    return (await raw.getAll().prefix(prefix + "/").exec()).kvs;
  }

  /** Puts `value` at `key` only if the key does not exist; true if it wrote. */
  async function create(key: string | Buffer, value: string | Buffer): Promise<boolean> {
    const res = await raw.if(key, "Create", "==", 0).then(raw.put(key).value(value)).commit();
    return res.succeeded;
  }

  const show = (key: string | Buffer, value: string | Buffer) => {
    const k = typeof key === "string" ? key : `bytes:${[...key]}`;
    const v = typeof value === "string"
      ? (value.length > 80
        ? `${value.slice(0, 40)}…(${value.length} chars)`
        : JSON.stringify(value))
      : `bytes:${[...value]}`;
    return `${k} = ${v}`;
  };

  return {
    kind: "etcd",
    spec,
    garbageKinds: ETCD_GARBAGE,

    async snapshot(): Promise<StoreSnapshot> {
      const masters: SnapshotMaster[] = [];
      const refs: SnapshotRef[] = [];
      const skipped: Record<string, number> = {};
      const skip = (what: string) => (skipped[what] = (skipped[what] ?? 0) + 1);
      for (const kv of await all()) {
        const key = utf8(kv.key);
        if (key === undefined) {
          skip("invalid UTF-8 key");
          continue;
        }
        if (key.startsWith(layout.masterRange)) {
          const id = layout.idOfMasterKey(key);
          const value = utf8(kv.value);
          if (id === undefined) skip("non-numeric ID");
          else if (value === undefined) skip("invalid UTF-8 master");
          else if (value === "") skip("empty master");
          else masters.push({ id, key: value });
          continue;
        }
        const parts = layout.splitRefKey(key);
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
    },

    async plant(kind: GarbageKind, targets: GarbageTargets): Promise<Planted> {
      const tag = `nemesis-ghost-${++planted}`;
      const written: string[] = [];
      const masterIds: number[] = [];
      const put = async (key: string | Buffer, value: string | Buffer) => {
        await raw.put(key).value(value);
        written.push(show(key, value));
      };
      const somewhere = async (value: string | Buffer): Promise<number | undefined> => {
        for (let i = 0; i < 20; i++) {
          const id = garbageId(targets);
          const key = layout.masterKey(id);
          if (await create(key, value)) {
            written.push(show(key, value));
            return id;
          }
        }
      };
      switch (kind) {
        case "non-numeric-id":
          await put(`${layout.masterRange}${tag}`, garbageKey(targets));
          break;
        case "empty-master":
          await somewhere("");
          break;
        case "bad-ref":
          await put(layout.refKey(garbageKey(targets), tag), "not-an-id");
          break;
        case "invalid-utf8":
          await somewhere(Buffer.from([0xff, 0xfe, 0x80]));
          await put(
            Buffer.concat([
              Buffer.from(`${layout.valuePrefix}/`),
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
          await put(layout.refKey(garbageKey(targets), tag), String(garbageId(targets)));
          break;
        default:
          throw new Error(`garbage kind ${kind} does not exist on etcd`);
      }
      return { kind, entries: written, masterIds };
    },

    async revokeLease(node: string): Promise<string> {
      const leases = new Set<string>();
      for (const kv of await all()) {
        const key = utf8(kv.key);
        const parts = key === undefined ? undefined : layout.splitRefKey(key);
        if (parts?.node === node && String(kv.lease) !== "0") leases.add(String(kv.lease));
      }
      for (const id of leases) await raw.leaseClient.leaseRevoke({ ID: id });
      return leases.size === 0
        ? `${node} had no reference, so no lease to revoke`
        : `revoked ${node}'s lease(s) ${[...leases].join(", ")}`;
    },

    async counts(): Promise<Record<string, number>> {
      const out: Record<string, number> = {};
      const inc = (what: string) => (out[what] = (out[what] ?? 0) + 1);
      for (const kv of await all()) {
        const key = utf8(kv.key) ?? "";
        if (key.startsWith(layout.masterRange)) inc("id");
        else if (layout.splitRefKey(key)) {
          inc(String(kv.lease) === "0" ? "value (no lease)" : "value");
        } else inc("other");
      }
      out["leases"] = (await raw.leaseClient.leaseLeases()).leases.length;
      return out;
    },

    [Symbol.asyncDispose](): Promise<void> {
      raw.close();
      return Promise.resolve();
    },
  };
}
