/**
 * `list`: every ID and its key, as a table or (`--json`) a JSON array, sorted by ID. One pass over
 * the masters through a read-only session; no lease, no cache.
 *
 * @module
 */
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import { listStore, plural, printable } from "./common.ts";

/** `list [--json]`. */
export async function listCommand(ctx: RunContext): Promise<number> {
  const { output } = ctx;
  const { store, rows, progress } = await listStore(ctx);
  progress.done(`listed ${plural(rows.length, "ID")}`);
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
  output.err.line(`${plural(rows.length, "ID")} under prefix ${store.prefix} in ${store.where}`);
  return ExitCode.Ok;
}
