/**
 * `refs [key]`: which nodes reference which key, with the ID each reference names and whether its
 * lease is alive, and totals; `--by-node` sums them per node. One pass over the references through
 * the backend's admin surface, with progress on long stores.
 *
 * @module
 */
import type { StoredReference } from "../../allocator/backend.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import type { Progress } from "../io.ts";
import type { Store } from "../store.ts";
import { writeTable } from "../table.ts";
import { noteIfEmpty, plural, printable } from "./common.ts";

/** Options of `refs`. */
export interface RefsCommandOptions {
  /** Only the references of this key. */
  readonly key?: string;
  /** One row per node instead of one per reference. */
  readonly byNode: boolean;
}

/** Every reference in the store (of `key` only, when given), with progress. */
export async function readReferences(
  ctx: RunContext,
  store: Store,
  progress: Progress,
  key?: string,
): Promise<StoredReference[]> {
  const out: StoredReference[] = [];
  let seen = 0;
  for await (const ref of store.admin.references(ctx.signal)) {
    if ((++seen & 1023) === 0) progress.update(`reading references… ${seen}`);
    if (key === undefined || ref.key === key) out.push(ref);
  }
  return out;
}

interface NodeTotals {
  node: string;
  references: number;
  live: number;
  dead: number;
}

function byNode(refs: readonly StoredReference[]): NodeTotals[] {
  const totals = new Map<string, NodeTotals>();
  for (const ref of refs) {
    let t = totals.get(ref.node);
    if (t === undefined) {
      totals.set(ref.node, t = { node: ref.node, references: 0, live: 0, dead: 0 });
    }
    t.references++;
    if (ref.live) t.live++;
    else t.dead++;
  }
  return [...totals.values()].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
}

/** `refs [key] [--by-node]`. */
export async function refsCommand(ctx: RunContext, options: RefsCommandOptions): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store();
  if (options.key !== undefined) store.backend.checkKey(options.key);
  const progress = ctx.progress();
  const exists = await noteIfEmpty(ctx, store);
  ctx.untimed();
  const refs = exists ? await readReferences(ctx, store, progress, options.key) : [];
  refs.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.node < b.node ? -1 : 1));
  const live = refs.filter((r) => r.live).length;
  const keys = new Set(refs.map((r) => r.key)).size;
  const nodes = byNode(refs);
  progress.done(`read ${plural(refs.length, "reference")}`);
  if (ctx.options.json) {
    const rows = options.byNode ? nodes : refs;
    output.out.write("[");
    rows.forEach((row, i) => output.out.write(`${i === 0 ? "\n" : ",\n"}${JSON.stringify(row)}`));
    output.out.line(rows.length === 0 ? "]" : "\n]");
    return ExitCode.Ok;
  }
  if (options.byNode) {
    writeTable(
      output.out,
      ["NODE", "REFERENCES", "LIVE", "DEAD"],
      nodes.map((t) => [t.node, String(t.references), String(t.live), String(t.dead)]),
    );
  } else {
    writeTable(
      output.out,
      ["ID", "NODE", "STATE", "KEY"],
      refs.map((r) => [String(r.id), r.node, r.live ? "live" : "dead", printable(r.key)]),
    );
  }
  output.err.line(
    `${plural(refs.length, "reference")} (${live} live, ${refs.length - live} dead) to ` +
      `${plural(keys, "key")} from ${plural(nodes.length, "node")} under prefix ${store.prefix} ` +
      `in ${store.where}`,
  );
  return ExitCode.Ok;
}
