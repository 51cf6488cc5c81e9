/**
 * The nemesis's record of an etcd store's changes (a run beside Cilium nodes): one watch of the
 * prefix for the whole run, every change of a master, a reference or a Cilium mutex passed on as a
 * {@linkcode StoreChange} with its revision and the instant it arrived.
 * The watch resumes after the revision it saw last when a member dies or the cluster is down, so
 * nothing is lost but the arrival times of what it replays; a compaction under it is written as a
 * gap.
 *
 * @module
 */
import type { IKeyValue, IWatchResponse } from "../../../deps/etcd3.ts";
import { EtcdLayout, parseId } from "../layout.ts";
import { strictText as utf8 } from "../txn.ts";
import { rawClient } from "./fixture.ts";
import type { StoreChange } from "../../../testing/store_changes.ts";

/** What one etcd event is, in the layout's words; `undefined` for locks and garbage. */
export function changeOf(
  layout: EtcdLayout,
  type: "Put" | "Delete",
  kv: IKeyValue,
  at: number,
): StoreChange | undefined {
  const key = utf8(kv.key);
  if (key === undefined) return undefined;
  const rev = Number(kv.mod_revision);
  const id = layout.idOfMasterKey(key);
  if (id !== undefined) {
    const value = type === "Put" ? utf8(kv.value) : undefined;
    // An unreadable or empty master names no key: for the history it is no master.
    return { t: "master", rev, at, id, key: value ? value : null };
  }
  const locks = layout.lockPrefix + "/";
  if (key.startsWith(locks)) {
    // `<lockPrefix>/<key or id/N>/<lease hex>`: Cilium's `concurrency.Mutex` keys.
    const rest = key.slice(locks.length);
    const slash = rest.lastIndexOf("/");
    if (slash <= 0) return undefined;
    return {
      t: "lock",
      rev,
      at,
      of: rest.slice(0, slash),
      lease: rest.slice(slash + 1),
      held: type === "Put",
    };
  }
  const ref = layout.splitRefKey(key);
  if (!ref) return undefined;
  const refId = type === "Put" ? parseId(utf8(kv.value) ?? "") ?? null : null;
  return { t: "ref", rev, at, ...ref, id: refId, lease: String(kv.lease ?? "0") };
}

/**
 * Starts passing the changes under `prefix` to `record`; resolves once the watch is attached
 * (nothing written after that is missed). Disposing it waits until the watch caught up with the
 * store's revision at that moment (at most 5 s), then stops.
 */
export async function recordEtcdChanges(
  endpoints: readonly string[],
  prefix: string,
  record: (change: StoreChange) => void,
): Promise<AsyncDisposable> {
  const raw = rawClient(endpoints);
  const layout = new EtcdLayout(prefix);
  let seen = 0;
  let caughtUp: (() => void) | undefined;
  let target = Infinity;
  const watcher = await raw.watch().prefix(prefix + "/").create();
  watcher.on("data", (res: IWatchResponse) => {
    const at = Date.now();
    for (const ev of res.events) {
      const change = changeOf(layout, ev.type, ev.kv, at);
      if (change) record(change);
    }
    seen = Math.max(seen, Number(res.header.revision));
    if (seen >= target) caughtUp?.();
  });
  watcher.on("error", (err: unknown) => {
    const gap: StoreChange = { t: "gap", at: Date.now(), why: String(err).slice(0, 300) };
    record(gap);
  });
  return {
    async [Symbol.asyncDispose]() {
      try {
        const now = Number((await raw.get(prefix + "/").exec()).header.revision);
        if (seen < now) {
          target = now;
          let timer: ReturnType<typeof setTimeout> | undefined;
          await new Promise<void>((resolve) => {
            caughtUp = resolve;
            timer = setTimeout(resolve, 5_000);
          });
          clearTimeout(timer);
        }
      } catch {
        // The store is gone already: what was seen is the record.
      } finally {
        await watcher.cancel().catch(() => {});
        raw.close();
      }
    },
  };
}
