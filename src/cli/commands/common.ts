/**
 * Helpers shared by the commands: the wrong-prefix check, "not found" results, printable keys and
 * the allocator options a CLI run uses.
 *
 * @module
 */
import type { AllocatorOptions } from "../../allocator/types.ts";
import type { BackendEvent, BackendSession, NodeLease } from "../../allocator/backend.ts";
import { InvalidOptionsError } from "../../errors.ts";
import { formatDuration } from "../args.ts";
import type { RunContext } from "../context.ts";
import { errorLine, ExitCode } from "../exit.ts";
import type { Progress } from "../io.ts";
import type { Store } from "../store.ts";

/** Throws an {@linkcode InvalidOptionsError} naming other prefixes when nothing is stored here. */
export async function requireNamespace(ctx: RunContext, store: Store): Promise<void> {
  if (await namespaceExists(ctx, store)) return;
  throw new InvalidOptionsError(await emptyNamespaceMessage(ctx, store));
}

/** Whether anything is stored under the prefix (never asks a store known to be empty). */
export async function namespaceExists(ctx: RunContext, store: Store): Promise<boolean> {
  return store.emptyBecause === undefined && await store.admin.namespaceExists(ctx.signal);
}

/** Why nothing is found under the prefix, with the prefixes the store does hold. */
export async function emptyNamespaceMessage(ctx: RunContext, store: Store): Promise<string> {
  if (store.emptyBecause !== undefined) {
    return `${store.emptyBecause}: nothing was allocated there, or --store is wrong`;
  }
  const others = await store.admin.otherNamespaces(ctx.signal);
  const hint = others.length > 0 ? `; prefixes in this store: ${others.join(", ")}` : "";
  return `nothing is stored under prefix ${store.prefix} in ${store.where} (wrong --prefix?${hint})`;
}

/**
 * For listings: notes on stderr that nothing is stored under the prefix (an empty list is an
 * answer, not an error: a new cluster has nothing yet). Returns whether anything is stored.
 */
export async function noteIfEmpty(ctx: RunContext, store: Store): Promise<boolean> {
  if (await namespaceExists(ctx, store)) return true;
  ctx.output.warn(`note: ${await emptyNamespaceMessage(ctx, store)}`);
  return false;
}

/**
 * Reports that `what` is not in the store: a usage error when the whole prefix is empty (most
 * likely a wrong `--prefix`), else {@linkcode ExitCode.NotFound}.
 */
export async function notFound(ctx: RunContext, store: Store, what: string): Promise<number> {
  await requireNamespace(ctx, store);
  return reportNotFound(ctx, what);
}

/** Says on stderr that `what` is not there (JSON with `--json`); returns the exit code. */
export function reportNotFound(ctx: RunContext, what: string): number {
  ctx.output.err.line(errorLine(ctx.options.json, ExitCode.NotFound, "NotFound", what));
  return ExitCode.NotFound;
}

/** Warns when an allocation is about to start a new prefix in a store that has others. */
export async function noteNewNamespace(ctx: RunContext, store: Store): Promise<void> {
  if (await namespaceExists(ctx, store)) return;
  const others = await store.admin.otherNamespaces(ctx.signal);
  if (others.length === 0) return;
  ctx.output.warn(
    `note: prefix ${store.prefix} is new in ${store.where} (it also has: ${others.join(", ")})`,
  );
}

/** `2026-11-26T11:31:05Z (in 45s)`: an instant for messages, and how far off it is. */
export function instant(at: number, now = Date.now()): string {
  const seconds = Math.max(0, Math.ceil((at - now) / 1000));
  return `${new Date(at).toISOString().replace(/\.\d+Z$/, "Z")} (in ${seconds}s)`;
}

/** The lease of node `node` if it is live: a running node's, or a run's that exited lately. */
export async function liveLease(
  ctx: RunContext,
  store: Store,
  node: string,
): Promise<NodeLease | undefined> {
  const leases = await store.admin.nodeLeases(ctx.signal);
  return leases.find((l) => l.node === node && l.live);
}

/** `until 2026-…Z (in 45s)`: until when other nodes count `lease` live. */
function untilText(store: Store, lease: NodeLease): string {
  const until = store.liveUntil(lease);
  return until === undefined ? "until its lease lapses" : `until ${instant(until)}`;
}

/** `node web1 is live until 2026-…Z (in 45s)`: who holds a name, and until when. */
export function liveNodeText(store: Store, lease: NodeLease): string {
  return `node ${lease.node} is live ${untilText(store, lease)}`;
}

/**
 * Refuses (exit 4, `NodeInUseError`) a run that would write under `--node` while that name's
 * lease is live: a running node's, or that of a run that exited and whose lease has not lapsed.
 * Two writers under one name share its references and its lease record, so one could cut the
 * other's and let the IDs they protect go to other keys. `consequence` says what this command
 * would do. Returns the exit code, or `undefined` when the name is free (or not given: the
 * default name is this run's own).
 */
export async function refuseLiveNode(
  ctx: RunContext,
  store: Store,
  consequence: string,
): Promise<number | undefined> {
  if (!ctx.options.nodeGiven) return undefined;
  const lease = await liveLease(ctx, store, ctx.options.node);
  if (lease === undefined) return undefined;
  const message = `node ${lease.node} is in use: its lease is live ${untilText(store, lease)} ` +
    `(it is running, or it exited and its lease has not lapsed yet); ${consequence}. Give --node ` +
    "a name of its own (or none), or wait until then";
  ctx.output.err.line(errorLine(ctx.options.json, ExitCode.Refused, "NodeInUseError", message));
  return ExitCode.Refused;
}

/** What `allocate` and `identity allocate` under a live node's name would do. */
export const WRITER_CONSEQUENCE = "a second writer under that name would share its references " +
  "and lease record: one could cut the other's, and the IDs they protect go to other keys";

/**
 * The note after an allocation without `--hold`: the run's reference outlives it until its lease
 * lapses (the run does not release it on exit, and nothing renews the lease after it), and
 * until then its `--node` name is taken.
 */
export async function referenceNote(ctx: RunContext, store: Store): Promise<string> {
  const node = store.backend.node;
  const lease = await liveLease(ctx, store, node).catch(() => undefined);
  const until = lease === undefined ? undefined : store.liveUntil(lease);
  const when = until === undefined
    ? `, ${formatDuration(ctx.options.leaseTtlMs)} (--lease-ttl) after its last renewal`
    : ` at ${instant(until)}`;
  const taken = ctx.options.nodeGiven ? `; until then --node ${node} is refused to other runs` : "";
  return `note: node ${node} references it after this run exits, until its lease lapses` +
    `${when}${taken}; --hold keeps it until Ctrl-C`;
}

/** `1 ID`, `2 IDs`: a count with its noun. */
export function plural(count: number, singular: string, pluralForm = `${singular}s`): string {
  return `${count} ${count === 1 ? singular : pluralForm}`;
}

// deno-lint-ignore no-control-regex
const CONTROL = /[\u0000-\u001f\u007f]/;

/** A key for a table cell: as is, or JSON-quoted when it holds control characters. */
export function printable(key: string): string {
  return CONTROL.test(key) ? JSON.stringify(key) : key;
}

/** The options of a writable allocator for this run (range, lease). */
export function allocatorOptions(ctx: RunContext): AllocatorOptions {
  return {
    min: ctx.options.min,
    max: ctx.options.max,
    leaseTtlMs: ctx.options.leaseTtlMs,
  };
}

/**
 * Every master of the store through a read-only session: the initial list of a watch, ended at
 * `synced`. Faster than an allocator's cache (nothing is kept but the pairs) and it shows
 * progress.
 */
export async function listMasters(
  ctx: RunContext,
  session: BackendSession,
  progress: Progress,
  noun = "IDs",
): Promise<Array<[number, string]>> {
  const rows: Array<[number, string]> = [];
  for await (const event of session.watch(ctx.signal) as AsyncIterable<BackendEvent>) {
    if (event.type === "synced") break;
    if (event.type === "upsert") {
      rows.push([event.id, event.key]);
      if ((rows.length & 1023) === 0) progress.update(`listing… ${rows.length} ${noun}`);
    }
  }
  ctx.signal.throwIfAborted();
  rows.sort((a, b) => a[0] - b[0]);
  return rows;
}

/**
 * What `list` and `identity list` start with: the store, then every master through a read-only
 * session, sorted by ID. Nothing under the prefix is an empty list (with a note on stderr).
 */
export async function listStore(
  ctx: RunContext,
  noun = "IDs",
): Promise<{ store: Store; rows: Array<[number, string]>; progress: Progress }> {
  const store = await ctx.store();
  const progress = ctx.progress();
  if (!(await noteIfEmpty(ctx, store))) return { store, rows: [], progress };
  // --timeout bounds reaching the store; a long list runs on (each store request has its own
  // deadline) until it is done or interrupted.
  ctx.untimed();
  const session = await store.reader(ctx.signal);
  const rows = await listMasters(ctx, session, progress, noun);
  return { store, rows, progress };
}

/** Resolves when `signal` aborts. */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  );
}

/** A signal that aborts after `ms` (for the last words after an interrupt); clear it with dispose. */
export function deadline(ms: number): AbortSignal & Disposable {
  const controller = new AbortController();
  const timer = setTimeout(
    () => controller.abort(new DOMException("deadline passed", "TimeoutError")),
    ms,
  );
  return Object.assign(controller.signal, {
    [Symbol.dispose]: () => clearTimeout(timer),
  });
}

/** Sleeps `ms`, or less when `signal` aborts (never rejects). */
export function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
