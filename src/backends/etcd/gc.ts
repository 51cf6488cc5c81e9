/**
 * GC support: listing masters with a version and a liveness verdict, and the guarded delete.
 *
 * A master's GC version is `<master mod revision>:<newest mod revision of its references>`, over
 * the exact references of its key that name its ID. It changes when the master is rewritten or a
 * node (re)writes a reference to it. A reference written and deleted entirely between two passes
 * leaves no trace in etcd (as in Cilium); that is safe because the delete itself is guarded: it
 * commits only if, at that instant, no exact reference names the ID.
 *
 * Liveness counts only references that name this master's ID, so a stale master of a key that
 * now lives under another ID (a cache-lag duplicate) is still collected.
 *
 * @example Two-round marking over the candidates (the allocator's GC does this)
 * ```ts ignore
 * for await (const c of gcList(core, { min: 256, max: 65535 }, signal)) {
 *   if (!c.inUse && marked.get(c.id) === c.version) await gcDelete(core, c, signal);
 * }
 * ```
 *
 * @module
 */
import type { ICompare, IKeyValue, IRequestOp } from "etcd3";
import { mutexGuards } from "./acquire.ts";
import type { GcCandidate } from "../../allocator/backend.ts";
import { idallocLogger } from "../../log.ts";
import type { SessionCore } from "./core.ts";
import { batches, utf8Length } from "./limits.ts";
import { rangePages } from "./paging.ts";
import {
  absent,
  del,
  kvsAt,
  ladderOutcome,
  modIs,
  nested,
  prefixRange,
  read,
  snapshotOf,
  text,
  unchangedSince,
  valueIsNot,
} from "./txn.ts";

// Corrupt entries are reported under the backend's own category, as the watch skips them too.
const log = idallocLogger("etcd");

/** Reference ranges read per transaction. */
const REFS_PER_TXN = 100;

/** A master as listed: ID, key, mod revision. */
export interface MasterEntry {
  readonly id: number;
  readonly key: string;
  readonly modRevision: string;
}

/**
 * Parses a listed master; logs and returns `undefined` for a corrupt one (a non-numeric ID, an
 * empty value), as Cilium's watcher does.
 */
export function parseMaster(core: SessionCore, kv: IKeyValue): MasterEntry | undefined {
  const etcdKey = text(kv.key);
  const id = core.layout.idOfMasterKey(etcdKey);
  if (id === undefined) {
    log.warning("skipping corrupt master {etcdKey}: the ID is not a decimal number", { etcdKey });
    return undefined;
  }
  const key = text(kv.value);
  if (key === "") {
    log.error("skipping corrupt master {etcdKey}: empty value", { etcdKey });
    return undefined;
  }
  return { id, key, modRevision: String(kv.mod_revision) };
}

/** Every master with `min <= id <= max`, with its GC version and liveness (see module doc). */
export async function* gcList(
  core: SessionCore,
  range: { min: number; max: number },
  signal: AbortSignal,
): AsyncGenerator<GcCandidate> {
  const { client, layout } = core;
  // Pinned pages; a compacted pin resumes at a newer revision: every delete is guarded anyway.
  const pages = rangePages(client, "gc list", prefixRange(layout.masterRange), signal, {
    onCompacted: "resume",
  });
  for await (const page of pages) {
    const masters: MasterEntry[] = [];
    for (const kv of page.kvs) {
      const m = parseMaster(core, kv);
      if (m && m.id >= range.min && m.id <= range.max) masters.push(m);
    }
    const weight = (m: MasterEntry) => 2 * utf8Length(m.key) + 256;
    for (const chunk of batches(masters, REFS_PER_TXN, weight)) {
      const res = await client.call("gc read references", signal, (o) =>
        client.raw.kv.txn({
          success: chunk.map((m) => read(prefixRange(layout.refPrefix(m.key) + "/"))),
        }, o));
      for (const [j, m] of chunk.entries()) {
        const kvs = res.responses[j]?.response_range?.kvs ?? [];
        const refs = snapshotOf(layout.refPrefix(m.key), kvs, String(res.header.revision))
          .exact.filter((r) => r.id === m.id);
        let newest = 0n;
        for (const r of refs) if (BigInt(r.modRevision) > newest) newest = BigInt(r.modRevision);
        yield {
          id: m.id,
          key: m.key,
          version: `${m.modRevision}:${newest}`,
          inUse: refs.length > 0,
        };
      }
    }
  }
}

/**
 * Deletes `candidate`'s master only if its mod revision is the listed one, no Cilium mutex is held
 * on its key or ID, and, at the commit point, no exact reference of its key names its ID. One
 * transaction, or two when the reference range also holds other keys' references naming the same
 * ID (then the second is guarded on "nothing in the range changed since the first"), or when the
 * mutex ranges hold only other paths' mutexes.
 */
export async function gcDelete(
  core: SessionCore,
  candidate: GcCandidate,
  signal: AbortSignal,
): Promise<boolean> {
  const { client, layout } = core;
  const masterMod = candidate.version.split(":")[0];
  if (!/^[0-9]+$/.test(masterMod)) return false;
  const masterKey = layout.masterKey(candidate.id);
  const refPrefix = layout.refPrefix(candidate.key);
  const range = prefixRange(refPrefix + "/");
  const id = String(candidate.id);
  const guards = mutexGuards(core, candidate.key)(candidate.id);

  const deleteOp: IRequestOp[] = [del(masterKey)];
  const guardedBy = (): ICompare[] => [
    modIs(masterKey, masterMod),
    ...guards.map((g) => g.compare()),
  ];
  for (let round = 0; round < 2; round++) {
    const res = await client.call("gc delete", signal, (o) =>
      client.raw.kv.txn({
        compare: guardedBy(),
        success: [
          nested([absent(range)], deleteOp, [
            nested([valueIsNot(range, id)], deleteOp, [read(range)]),
          ]),
        ],
        failure: guards.map((g) => g.read()),
      }, o));
    const revision = String(res.header.revision);
    if (!res.succeeded) {
      // A changed master, or a held mutex: not this pass. Other paths' mutexes: once more.
      const held = guards.flatMap((g, i) => g.learn(kvsAt(res.responses, i), revision));
      if (held.length > 0 || guards.length === 0) return false;
      continue;
    }
    const outcome = ladderOutcome(res.responses[0]);
    if (outcome.applied) return true;
    const snap = snapshotOf(refPrefix, outcome.kvs ?? [], revision);
    if (snap.exact.some((r) => r.id === candidate.id)) return false;
    const compare = [...guardedBy(), unchangedSince(range, snap.revision)];
    const second = await client.call(
      "gc delete",
      signal,
      (o) => client.raw.kv.txn({ compare, success: deleteOp, failure: [] }, o),
    );
    return second.succeeded;
  }
  return false;
}
