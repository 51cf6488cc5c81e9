/**
 * `watch`: the store's ID ↔ key changes as JSON lines until Ctrl-C. A read-only allocator (no
 * lease) follows the store, so a store that goes away and comes back is re-listed and the stream
 * goes on; deletes carry the key they had.
 *
 * Nothing there yet is not an error for `watch` (unlike lookups and `gc`): "watch in one
 * terminal, allocate in another" is how a new cluster is first watched. An empty prefix, or a
 * Deno KV file that does not exist yet, gets a note on stderr naming what is missing (so a wrong
 * `--store` or `--prefix` shows), and the stream starts once the first IDs arrive; a missing
 * file is waited for (checked every `--poll`), never created.
 *
 * @module
 */
import { Allocator } from "../../allocator/allocator.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { openStore, type Store } from "../store.ts";
import { emptyNamespaceMessage, namespaceExists, pause } from "./common.ts";

/** Options of `watch`. */
export interface WatchCommandOptions {
  /** Print the current mappings first (as upserts). */
  readonly replay: boolean;
}

/** `watch [--no-replay]`. */
export async function watchCommand(ctx: RunContext, options: WatchCommandOptions): Promise<number> {
  const { output } = ctx;
  let store = await ctx.store();
  if (!(await namespaceExists(ctx, store))) {
    const missing = store.emptyBecause !== undefined;
    output.warn(
      `note: ${await emptyNamespaceMessage(ctx, store)}; watching for the first ` +
        `${missing ? "allocation to create it" : "IDs"} (Ctrl-C to stop)`,
    );
    if (missing) {
      ctx.untimed();
      const created = await untilCreated(ctx, store.pollIntervalMs ?? DEFAULT_RECHECK_MS);
      if (created === undefined) return ExitCode.Ok;
      store = created;
    }
  }
  await using allocator = await Allocator.open(store.backend, {
    min: 1,
    max: Number.MAX_SAFE_INTEGER,
    readOnly: true,
  }, { signal: ctx.signal });
  // The deadline covers reaching the store and the initial list; the stream itself runs until
  // interrupted.
  await allocator.waitForInitialSync({ signal: ctx.signal });
  ctx.untimed();
  let live = false;
  for await (const event of allocator.watch({ signal: ctx.interrupt })) {
    if (event.type === "synced") {
      live = true;
      output.out.line(JSON.stringify({ type: "synced" }));
    } else if (live || options.replay) {
      output.out.line(JSON.stringify(event));
    }
    // The replay is written in large chunks; live events go out one by one, as they happen.
    if (live) await output.out.flush();
  }
  return ExitCode.Ok;
}

/** How often a missing store is looked for when its backend names no poll interval, in ms. */
const DEFAULT_RECHECK_MS = 1_000;

/**
 * Opens the store again every `everyMs` (the backend's poll interval: `--poll` on Deno KV) until
 * its file exists (never creating it), then returns it opened for the rest of the run;
 * `undefined` when interrupted first.
 */
async function untilCreated(ctx: RunContext, everyMs: number): Promise<Store | undefined> {
  for (;;) {
    await pause(everyMs, ctx.interrupt);
    if (ctx.interrupt.aborted) return undefined;
    const probe = await openStore(ctx.options, { create: false, signal: ctx.interrupt });
    const exists = probe.emptyBecause === undefined;
    await probe.close();
    if (exists) return await ctx.store();
  }
}
