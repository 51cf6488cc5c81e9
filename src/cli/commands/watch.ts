/**
 * `watch`: the store's ID ↔ key changes as JSON lines until Ctrl-C. A read-only allocator (no
 * lease) follows the store, so a store that goes away and comes back is re-listed and the stream
 * goes on; deletes carry the key they had.
 *
 * @module
 */
import { Allocator } from "../../allocator/allocator.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { requireNamespace } from "./common.ts";

/** Options of `watch`. */
export interface WatchCommandOptions {
  /** Print the current mappings first (as upserts). */
  readonly replay: boolean;
}

/** `watch [--no-replay]`. */
export async function watchCommand(ctx: RunContext, options: WatchCommandOptions): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store();
  await requireNamespace(ctx, store);
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
