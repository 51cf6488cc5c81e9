/**
 * Helpers shared by the commands: the wrong-prefix check, "not found" results, printable keys and
 * the allocator options a CLI run uses.
 *
 * @module
 */
import type { AllocatorOptions } from "../../allocator/types.ts";
import type { BackendEvent, BackendSession } from "../../allocator/backend.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import type { Progress } from "../io.ts";
import type { Store } from "../store.ts";

/** Throws an {@linkcode InvalidOptionsError} naming other prefixes when nothing is stored here. */
export async function requireNamespace(ctx: RunContext, store: Store): Promise<void> {
  if (await store.namespaceExists(ctx.signal)) return;
  throw new InvalidOptionsError(await missingNamespaceMessage(ctx, store));
}

async function missingNamespaceMessage(ctx: RunContext, store: Store): Promise<string> {
  const others = await store.otherNamespaces(ctx.signal);
  const hint = others.length > 0
    ? `; prefixes in this store: ${others.slice(0, 8).join(", ")}`
    : "";
  return `nothing is stored under prefix ${store.prefix} in ${store.where} (wrong --prefix?${hint})`;
}

/**
 * Reports that `what` is not in the store: a usage error when the whole prefix is empty (most
 * likely a wrong `--prefix`), else {@linkcode ExitCode.NotFound}.
 */
export async function notFound(ctx: RunContext, store: Store, what: string): Promise<number> {
  if (!(await store.namespaceExists(ctx.signal))) {
    throw new InvalidOptionsError(await missingNamespaceMessage(ctx, store));
  }
  ctx.output.warn(what);
  return ExitCode.NotFound;
}

/** Warns when an allocation is about to start a new prefix in a store that has others. */
export async function noteNewNamespace(ctx: RunContext, store: Store): Promise<void> {
  if (await store.namespaceExists(ctx.signal)) return;
  const others = await store.otherNamespaces(ctx.signal);
  if (others.length === 0) return;
  ctx.output.warn(
    `note: prefix ${store.prefix} is new in ${store.where} (it also has: ${
      others.slice(0, 8).join(", ")
    })`,
  );
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
  const stop = new AbortController();
  const signal = AbortSignal.any([ctx.signal, stop.signal]);
  try {
    for await (const event of session.watch(signal) as AsyncIterable<BackendEvent>) {
      if (event.type === "synced") {
        // Abort before leaving the loop: the Deno KV feed's cleanup waits for its wake-up source,
        // which only an abort (or the next poll) releases.
        stop.abort();
        break;
      }
      if (event.type === "upsert") {
        rows.push([event.id, event.key]);
        if ((rows.length & 1023) === 0) progress.update(`listing… ${rows.length} ${noun}`);
      }
    }
  } finally {
    stop.abort();
  }
  ctx.signal.throwIfAborted();
  rows.sort((a, b) => a[0] - b[0]);
  return rows;
}

/**
 * What `list` and `identity list` start with: the store (which must hold something under the
 * prefix), then every master through a read-only session, sorted by ID.
 */
export async function listStore(
  ctx: RunContext,
  noun = "IDs",
): Promise<{ store: Store; rows: Array<[number, string]>; progress: Progress }> {
  const store = await ctx.store();
  await requireNamespace(ctx, store);
  // --timeout bounds reaching the store; a long list runs on (each store request has its own
  // deadline) until it is done or interrupted.
  ctx.untimed();
  const session = await store.reader(ctx.signal);
  const progress = ctx.progress();
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
