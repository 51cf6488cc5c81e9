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
 * One bad entry never stops a pass. A master with a non-numeric ID, an empty value, a value that
 * is not UTF-8, or a key the layout cannot hold (too large for a request, or moved out of
 * `value/` by Go's path cleaning), is skipped, logged and reported to `onSkip`; so is a master
 * whose reference range alone exceeds the response limit, and an entry that alone exceeds it in
 * the paged list. A skipped master is never a candidate, so it is never collected.
 *
 * @example Two-round marking over the candidates (the allocator's GC does this)
 * ```ts ignore
 * // ignored: needs a session's context on a running etcd (tests/backends/etcd/gc.test.ts runs it)
 * for await (const c of gcList(ctx, { min: 256, max: 65535 }, signal)) {
 *   if (!c.inUse && marked.get(c.id) === c.version) await gcDelete(ctx, c, signal);
 * }
 * ```
 *
 * @module
 */
import type { ICompare, IKeyValue, IRequestOp } from "../../deps/etcd3.ts";
import { mutexGuards } from "./acquire.ts";
import type { GcCandidate, GcListOptions } from "../../allocator/backend.ts";
import { type GcSkip, shorten } from "../../allocator/damage.ts";
import { idallocLogger } from "../../log.ts";
import { ResponseTooLarge } from "./client.ts";
import type { EtcdContext } from "./context.ts";
import { keyProblem } from "./layout.ts";
import { batches } from "../shared/batching.ts";
import { BATCH_BYTES, utf8Length } from "./limits.ts";
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
  strictText,
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
 * Parses a listed master; logs, reports to `onSkip` and returns `undefined` for a corrupt one (a
 * non-numeric ID, an empty value, as Cilium's watcher does; and a value that is not UTF-8, which
 * no key can be).
 */
export function parseMaster(
  ctx: Pick<EtcdContext, "layout">,
  kv: IKeyValue,
  onSkip?: (skip: GcSkip) => void,
): MasterEntry | undefined {
  const etcdKey = text(kv.key);
  const skip = (kind: GcSkip["kind"], reason: string) => {
    log.warning("skipping corrupt master {etcdKey}: {reason}", {
      etcdKey: shorten(etcdKey),
      reason,
    });
    onSkip?.({ kind, entry: shorten(etcdKey), reason });
    return undefined;
  };
  const id = ctx.layout.idOfMasterKey(etcdKey);
  if (id === undefined) return skip("master-bad-id", "the ID is not a decimal number");
  const key = strictText(kv.value);
  if (key === undefined) return skip("master-undecodable", "the value is not UTF-8");
  if (key === "") return skip("master-empty", "empty value");
  return { id, key, modRevision: String(kv.mod_revision) };
}

/** Every master with `min <= id <= max`, with its GC version and liveness (see module doc). */
export async function* gcList(
  ctx: EtcdContext,
  range: { min: number; max: number },
  signal: AbortSignal,
  options: GcListOptions = {},
): AsyncGenerator<GcCandidate> {
  const { client, layout } = ctx;
  const onSkip = options.onSkip ?? (() => {});
  // Pinned pages; a compacted pin resumes at a newer revision: every delete is guarded anyway.
  const pages = rangePages(client, "gc list", prefixRange(layout.masterRange), signal, {
    onCompacted: "resume",
  });
  for await (const page of pages) {
    for (const { key } of page.tooLarge) {
      const id = layout.idOfMasterKey(text(key));
      if (id !== undefined && (id < range.min || id > range.max)) continue;
      skipMaster(onSkip, text(key), "the entry alone exceeds the response limit");
    }
    const masters: MasterEntry[] = [];
    for (const kv of page.kvs) {
      const id = layout.idOfMasterKey(text(kv.key));
      if (id !== undefined && (id < range.min || id > range.max)) continue;
      const m = parseMaster(ctx, kv, onSkip);
      if (m === undefined) continue;
      const problem = keyProblem(layout, m.key);
      if (problem !== undefined) {
        skipMaster(onSkip, layout.masterKey(m.id), `its key cannot be stored: ${problem}`);
        continue;
      }
      masters.push(m);
    }
    const weight = (m: MasterEntry) => 2 * utf8Length(m.key) + 256;
    for (
      const chunk of batches(masters, [REFS_PER_TXN, BATCH_BYTES], (m) => [1, weight(m)])
    ) {
      yield* judge(ctx, chunk, signal, onSkip);
    }
  }
}

function skipMaster(onSkip: (skip: GcSkip) => void, etcdKey: string, why: string): void {
  const [entry, reason] = [shorten(etcdKey), shorten(why)];
  log.warning("skipping master {entry}: {reason}", { entry, reason });
  onSkip({ kind: "master-oversized", entry, reason });
}

/**
 * Reads the references of `chunk` in one transaction and judges each master. A response over the
 * limit is read again in halves; a master whose references alone exceed it is skipped.
 */
async function* judge(
  ctx: EtcdContext,
  chunk: readonly MasterEntry[],
  signal: AbortSignal,
  onSkip: (skip: GcSkip) => void,
): AsyncGenerator<GcCandidate> {
  const { client, layout } = ctx;
  let res;
  try {
    res = await client.call("gc read references", signal, (o) =>
      client.raw.kv.txn({
        success: chunk.map((m) => read(prefixRange(layout.refPrefix(m.key) + "/"))),
      }, o));
  } catch (err) {
    if (!(err instanceof ResponseTooLarge)) throw err;
    if (chunk.length === 1) {
      skipMaster(onSkip, layout.masterKey(chunk[0].id), "its references exceed the response limit");
      return;
    }
    const half = Math.ceil(chunk.length / 2);
    yield* judge(ctx, chunk.slice(0, half), signal, onSkip);
    yield* judge(ctx, chunk.slice(half), signal, onSkip);
    return;
  }
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

/**
 * Deletes `candidate`'s master only if its mod revision is the listed one, no Cilium mutex is held
 * on its key or ID, and, at the commit point, no exact reference of its key names its ID. One
 * transaction, or two when the reference range also holds other keys' references naming the same
 * ID (then the second is guarded on "nothing in the range changed since the first"), or when the
 * mutex ranges hold only other paths' mutexes.
 */
export async function gcDelete(
  ctx: EtcdContext,
  candidate: GcCandidate,
  signal: AbortSignal,
): Promise<boolean> {
  const { client, layout } = ctx;
  const masterMod = candidate.version.split(":")[0];
  if (!/^[0-9]+$/.test(masterMod)) return false;
  const masterKey = layout.masterKey(candidate.id);
  const refPrefix = layout.refPrefix(candidate.key);
  const range = prefixRange(refPrefix + "/");
  const id = String(candidate.id);
  const guards = mutexGuards(ctx, candidate.key)(candidate.id);

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
