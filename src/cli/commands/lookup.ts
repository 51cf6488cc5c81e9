/**
 * `get <key>` and `get-id <id>`: one read each through a read-only session (no lease, no cache to
 * fill), printing just the value so that scripts can use it (`id=$(idalloc get app=web;)`).
 *
 * @module
 */
import { parseIdArgument } from "../args.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { notFound, printable } from "./common.ts";

/** `get <key>`: the key's ID. */
export async function getCommand(ctx: RunContext, key: string): Promise<number> {
  const store = await ctx.store();
  store.backend.checkKey(key);
  const session = await store.reader(ctx.signal);
  const id = await session.get(key, ctx.signal);
  if (id === undefined) return await notFound(ctx, store, `key ${printable(key)} has no ID`);
  ctx.output.out.line(ctx.options.json ? JSON.stringify({ key, id }) : String(id));
  return ExitCode.Ok;
}

/** `get-id <id>`: the ID's key. */
export async function getIdCommand(ctx: RunContext, text: string): Promise<number> {
  const id = parseIdArgument(text);
  const store = await ctx.store();
  const session = await store.reader(ctx.signal);
  const key = await session.getById(id, ctx.signal);
  if (key === undefined) return await notFound(ctx, store, `ID ${id} is not allocated`);
  ctx.output.out.line(ctx.options.json ? JSON.stringify({ id, key }) : printable(key));
  return ExitCode.Ok;
}
