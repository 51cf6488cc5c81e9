/**
 * `list`: every ID and its key, as a table or (`--json`) a JSON array, sorted by ID. One pass over
 * the masters through a read-only session; no lease, no cache.
 *
 * @module
 */
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import { listMasters, printable, requireNamespace } from "./common.ts";

/** `list [--json]`. */
export async function listCommand(ctx: RunContext): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store();
  await requireNamespace(ctx, store);
  // --timeout bounds reaching the store; a long list runs on (each store request has its own
  // deadline) until it is done or interrupted.
  ctx.untimed();
  const session = await store.reader(ctx.signal);
  const progress = ctx.progress();
  const rows = await listMasters(ctx, session, progress);
  progress.done(`listed ${rows.length} IDs`);
  if (ctx.options.json) {
    output.out.write("[");
    for (let i = 0; i < rows.length; i++) {
      const [id, key] = rows[i];
      output.out.write(`${i === 0 ? "\n" : ",\n"}${JSON.stringify({ id, key })}`);
    }
    output.out.line(rows.length === 0 ? "]" : "\n]");
    return ExitCode.Ok;
  }
  writeTable(output.out, ["ID", "KEY"], rows.map(([id, key]) => [String(id), printable(key)]));
  output.err.line(`${rows.length} IDs under prefix ${store.prefix} in ${store.where}`);
  return ExitCode.Ok;
}
