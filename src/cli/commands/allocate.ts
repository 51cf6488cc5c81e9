/**
 * `allocate <key>` and `release <key>`.
 *
 * The CLI is a node only while it runs. `allocate` makes sure the key has its cluster-wide ID
 * (creating it if no node has one) and references it in the name of `--node` (by default a name of
 * its own, `cli-<host>-<pid>-<random>`). That reference is bound to the run's lease: without `--hold` it
 * lapses `--lease-ttl` after the process exits, and the ID then lives on only while some other node
 * references the key (GC collects it two passes later otherwise). With `--hold` the CLI keeps the
 * lease alive until Ctrl-C, then releases the key, like a node that stops using it.
 *
 * A fresh process holds nothing to release, so `release <key> --node <name>` is the operator's
 * tool: it deletes that node's reference to the key from the store directly (no lease is taken in
 * the node's name). Other nodes' references and the ID's master stay. It refuses (exit 4) the
 * reference of a live node (on etcd: one bound to a lease, which exists only while the lease
 * lives): that would take the ID from under a running node, which re-creates its reference at its
 * next sync anyway. It is for what dead nodes left behind (Deno KV references GC has not swept
 * yet, references written without a lease).
 *
 * @module
 */
import { Allocator } from "../../allocator/allocator.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import { formatDuration } from "../args.ts";
import type { RunContext } from "../context.ts";
import { errorLine, ExitCode } from "../exit.ts";
import {
  aborted,
  allocatorOptions,
  deadline,
  noteNewNamespace,
  printable,
  reportNotFound,
  requireNamespace,
} from "./common.ts";

/** Options of `allocate`. */
export interface AllocateCommandOptions {
  /** Keep the reference (and the lease) until interrupted, then release. */
  readonly hold: boolean;
}

/** Time the release after an interrupt may take. */
const RELEASE_GRACE_MS = 10_000;

/** `allocate <key> [--hold]`. */
export async function allocateCommand(
  ctx: RunContext,
  key: string,
  options: AllocateCommandOptions,
): Promise<number> {
  const { output } = ctx;
  const store = await ctx.store(true);
  store.backend.checkKey(key);
  await noteNewNamespace(ctx, store);
  await using allocator = await Allocator.open(store.backend, allocatorOptions(ctx), {
    signal: ctx.signal,
  });
  const { id, isNew } = await allocator.allocate(key, { signal: ctx.signal });
  const node = store.backend.node;
  if (ctx.options.json) {
    output.out.line(JSON.stringify({ key, id, isNew, node, hold: options.hold }));
  } else {
    output.out.line(`ID ${id} for ${printable(key)} (${isNew ? "created" : "existing"})`);
  }
  if (!options.hold) {
    if (!ctx.options.json) {
      output.warn(
        `note: node ${node} references it until its lease lapses ` +
          `(${formatDuration(ctx.options.leaseTtlMs)} after exit); --hold keeps it until Ctrl-C`,
      );
    }
    return ExitCode.Ok;
  }
  ctx.untimed();
  if (!ctx.options.json) output.warn(`holding ID ${id} as node ${node}; Ctrl-C releases it`);
  await output.flush();
  await aborted(ctx.interrupt);
  using grace = deadline(RELEASE_GRACE_MS);
  const { lastUse } = await allocator.release(key, { signal: grace });
  if (ctx.options.json) output.out.line(JSON.stringify({ key, id, released: lastUse, node }));
  else output.out.line(`released ID ${id} for ${printable(key)} (node ${node})`);
  return ExitCode.Ok;
}

/** `release <key> --node <name>`. */
export async function releaseCommand(ctx: RunContext, key: string): Promise<number> {
  if (!ctx.options.nodeGiven) {
    throw new InvalidOptionsError(
      "release needs --node <name>: the node whose reference to delete (a new CLI process holds " +
        "nothing; use allocate --hold to allocate and release in one run)",
    );
  }
  const { output } = ctx;
  const node = ctx.options.node;
  const store = await ctx.store();
  store.backend.checkKey(key);
  await requireNamespace(ctx, store);
  const session = await store.reader(ctx.signal);
  const id = await session.get(key, ctx.signal);
  let existed: boolean;
  try {
    existed = await store.admin.deleteReference(key, node, ctx.signal);
  } catch (err) {
    if (!(err instanceof LiveEntryError)) throw err;
    // Refused, not failed: say who holds it and what to do instead.
    const what =
      `node ${node} is live: its reference to ${printable(key)}${
        id === undefined ? "" : ` (ID ${id})`
      } stays, as deleting it would take the ID from under a running node (which writes it back at ` +
      `its next sync anyway). Release the key in ${node} or stop it; its references go with its ` +
      "lease (a CLI run's --lease-ttl after it exits)";
    output.err.line(errorLine(ctx.options.json, ExitCode.Refused, err.name, what));
    return ExitCode.Refused;
  }
  if (!existed) {
    // The same words on both backends: on etcd a key's ID is found through its references
    // (Cilium's GetNoCache), so after its last reference is gone etcd no longer knows the ID
    // while Deno KV's key index still does.
    return reportNotFound(ctx, `node ${node} holds no reference to ${printable(key)}`);
  }
  if (ctx.options.json) output.out.line(JSON.stringify({ key, id, node, released: true }));
  else {
    output.out.line(
      `node ${node} no longer references ${printable(key)}${
        id === undefined ? "" : ` (ID ${id})`
      }; ` +
        `the ID stays until GC finds no node using it`,
    );
  }
  return ExitCode.Ok;
}
