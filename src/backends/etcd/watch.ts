/**
 * List-and-watch of the masters (Cilium's `ListAndWatch`): a paginated list of `<prefix>/id/` at
 * one revision, `synced` once, then a watch from the next revision. A broken stream resumes from
 * the last revision seen; a compacted one re-lists and reports what vanished as deletes.
 *
 * @example
 * ```ts
 * import type { EtcdContext } from "./context.ts";
 * import { watchMasters } from "./watch.ts";
 *
 * // Needs a session's context on a running etcd: a function here, so that it is type-checked.
 * async function listed(ctx: EtcdContext, signal: AbortSignal): Promise<number> {
 *   let masters = 0;
 *   for await (const ev of watchMasters(ctx, signal)) {
 *     if (ev.type === "synced") return masters; // the initial list is complete
 *     if (ev.type === "upsert") masters++;
 *   }
 *   return masters;
 * }
 * ```
 *
 * @module
 */
import type { IWatchResponse } from "../../deps/etcd3.ts";
import type { BackendEvent } from "../../allocator/backend.ts";
import { shorten } from "../../allocator/damage.ts";
import { idallocLogger } from "../../log.ts";
import { accessDenied, closeStream, type DuplexStream } from "./client.ts";
import { StoreAccessDeniedError } from "./errors.ts";
import { summarize } from "./failure.ts";
import { sleep } from "../../abort.ts";
import type { EtcdContext } from "./context.ts";
import type { EtcdLayout } from "./layout.ts";
import { type MasterEntry, parseMaster } from "./gc.ts";
import { rangePages, RevisionCompacted } from "./paging.ts";
import { prefixRange, text } from "./txn.ts";
import { errorMessage } from "../../errors.ts";

const log = idallocLogger("etcd");

/** Backoff bounds between watch (re)creations after failures. */
const RETRY_MIN_MS = 50;
const RETRY_MAX_MS = 2000;

/** The watch's start revision was compacted away: the caller must re-list. */
class Compacted extends Error {
  readonly compactRevision: string;
  constructor(compactRevision: string) {
    super(`watch revision compacted (compact revision ${compactRevision})`);
    this.name = "Compacted";
    this.compactRevision = compactRevision;
  }
}

/** Lists every master at one revision (the first page's; a compacted one starts over). */
async function listMasters(
  ctx: EtcdContext,
  signal: AbortSignal,
): Promise<{ entries: MasterEntry[]; revision: string }> {
  const { client, layout } = ctx;
  const all = prefixRange(layout.masterRange);
  for (;;) {
    const entries: MasterEntry[] = [];
    let revision = "0";
    try {
      for await (const page of rangePages(client, "list masters", all, signal)) {
        revision = page.revision;
        for (const { key } of page.tooLarge) {
          log.warning("skipping master {etcdKey}: the entry alone exceeds the response limit", {
            etcdKey: shorten(text(key)),
          });
        }
        for (const kv of page.kvs) {
          const m = parseMaster(ctx, kv);
          if (m) entries.push(m);
        }
      }
      return { entries, revision };
    } catch (err) {
      // The list's revision was compacted between two pages: start over at a newer one.
      if (err instanceof RevisionCompacted) continue;
      throw err;
    }
  }
}

/** A queue fed by a gRPC watch stream, read with `await next()`. */
class StreamQueue {
  readonly #items: Array<IWatchResponse | Error> = [];
  #wake: (() => void) | undefined;

  push(item: IWatchResponse | Error): void {
    this.#items.push(item);
    this.#wake?.();
    this.#wake = undefined;
  }

  async next(signal: AbortSignal): Promise<IWatchResponse> {
    while (this.#items.length === 0) {
      signal.throwIfAborted();
      await new Promise<void>((resolve) => {
        const onAbort = () => resolve();
        this.#wake = () => {
          signal.removeEventListener("abort", onAbort);
          resolve();
        };
        signal.addEventListener("abort", onAbort, { once: true });
      });
    }
    const item = this.#items.shift()!;
    if (item instanceof Error) throw item;
    return item;
  }
}

/** Watch responses for the masters from `startRevision`; throws {@linkcode Compacted}. */
async function* watchFrom(
  ctx: EtcdContext,
  startRevision: bigint,
  signal: AbortSignal,
): AsyncGenerator<IWatchResponse> {
  const { client, layout } = ctx;
  await client.limiter.take(signal);
  client.assertOpen();
  const stream = await client.raw.watch.watch() as unknown as DuplexStream;
  const queue = new StreamQueue();
  let done = false;
  stream.on("data", (res: IWatchResponse) => queue.push(res));
  stream.on("error", (err: Error) => {
    if (!done) queue.push(err);
  });
  stream.on("end", () => {
    if (!done) queue.push(new Error("watch stream ended"));
  });
  const onAbort = () => closeStream(stream);
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    stream.write({
      create_request: {
        ...prefixRange(layout.masterRange),
        start_revision: startRevision.toString(),
        progress_notify: true,
      },
    });
    for (;;) {
      const res = await queue.next(signal);
      if (res.compact_revision && res.compact_revision !== "0") {
        throw new Compacted(String(res.compact_revision));
      }
      if (res.canceled) {
        throw new Error(`watch canceled: ${res.cancel_reason || "no reason given"}`);
      }
      if (res.created && (res.events ?? []).length === 0) {
        client.noteHealthy();
        continue;
      }
      yield res;
    }
  } finally {
    done = true;
    signal.removeEventListener("abort", onAbort);
    closeStream(stream);
  }
}

/** What the feed has reported: every master upserted (ID → mod revision), and how far it got. */
export interface FeedState {
  readonly known: Map<number, string>;
  /** The last revision whose changes were all reported (the watch resumes after it). */
  revision: bigint;
}

/** The session's `watch` (see the module doc). Ends when `signal` aborts. */
export async function* watchMasters(
  ctx: EtcdContext,
  signal: AbortSignal,
): AsyncGenerator<BackendEvent> {
  const { client, layout } = ctx;
  const state: FeedState = { known: new Map(), revision: 0n };
  let synced = false;
  /** Why the masters are listed next (`undefined`: they are not). */
  let relist: "initial" | "compacted" | undefined = "initial";
  let pause = RETRY_MIN_MS;

  while (!signal.aborted) {
    try {
      if (relist) {
        client.telemetry.relist(relist);
        yield* relisted(state, await listMasters(ctx, signal));
        relist = undefined;
        if (!synced) {
          synced = true;
          yield { type: "synced" };
        }
      }
      for await (const res of watchFrom(ctx, state.revision + 1n, signal)) {
        pause = RETRY_MIN_MS;
        client.noteHealthy();
        // etcd keeps no write time: the change is dated by the arrival of its notification.
        yield* watched(layout, state, res, Date.now());
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof Compacted) {
        log.info("watch of masters compacted at {rev}; re-listing", { rev: err.compactRevision });
        relist = "compacted";
        continue;
      }
      if (!await recover(ctx, err, state.revision, pause, signal)) return;
      pause = Math.min(pause * 2, RETRY_MAX_MS);
    }
  }
}

/**
 * The events of a (re)list at `listed.revision`: an upsert of each master not reported at its
 * mod revision yet, a delete of each reported one that is gone. Updates `state`.
 */
export function relisted(
  state: FeedState,
  listed: { readonly entries: readonly MasterEntry[]; readonly revision: string },
): BackendEvent[] {
  const { known } = state;
  const events: BackendEvent[] = [];
  const seen = new Set<number>();
  for (const m of listed.entries) {
    seen.add(m.id);
    if (known.get(m.id) === m.modRevision) continue;
    known.set(m.id, m.modRevision);
    events.push({ type: "upsert", id: m.id, key: m.key, version: m.modRevision });
  }
  for (const id of [...known.keys()]) {
    if (seen.has(id)) continue;
    known.delete(id);
    events.push({ type: "delete", id });
  }
  state.revision = BigInt(listed.revision);
  return events;
}

/**
 * The events of one watch response, dated `at`: upserts of readable masters, deletes of reported
 * ones (corrupt masters are skipped, as the list skips them). Updates `state`, including the
 * revision a progress notification vouches for.
 */
export function watched(
  layout: EtcdLayout,
  state: FeedState,
  res: Pick<IWatchResponse, "events" | "header">,
  at: number,
): BackendEvent[] {
  const events: BackendEvent[] = [];
  for (const ev of res.events ?? []) {
    const rev = BigInt(ev.kv.mod_revision);
    if (rev > state.revision) state.revision = rev;
    if (ev.type === "Delete") {
      const id = layout.idOfMasterKey(text(ev.kv.key));
      if (id !== undefined && state.known.delete(id)) events.push({ type: "delete", id, at });
      continue;
    }
    const m = parseMaster({ layout }, ev.kv);
    if (!m) continue;
    state.known.set(m.id, m.modRevision);
    events.push({ type: "upsert", id: m.id, key: m.key, version: m.modRevision, at });
  }
  // A progress notification promises that nothing at or below its revision is pending.
  if ((res.events ?? []).length === 0) {
    const progress = BigInt(res.header.revision);
    if (progress > state.revision) state.revision = progress;
  }
  return events;
}

/**
 * After a failed watch: notes the error and backs off; `false` when the feed must end. Access
 * the store denies ends it with `StoreAccessDeniedError`.
 */
async function recover(
  ctx: EtcdContext,
  err: unknown,
  revision: bigint,
  pause: number,
  signal: AbortSignal,
): Promise<boolean> {
  const { client } = ctx;
  client.noteError("watch", err);
  // Denied access stays denied: retrying would only hide it until the caller's deadline.
  if (accessDenied(err)) {
    if (err instanceof StoreAccessDeniedError) throw err;
    throw new StoreAccessDeniedError(
      `etcd refused the watch of ${ctx.layout.masterRange}: ${summarize(err)}`,
      { cause: err },
    );
  }
  client.telemetry.reconnect(err);
  log.warning("watch of masters failed, resuming from revision {rev}: {err}", {
    rev: String(revision),
    err: errorMessage(err),
  });
  try {
    await sleep(pause, signal);
  } catch {
    return false;
  }
  return !client.closed;
}
