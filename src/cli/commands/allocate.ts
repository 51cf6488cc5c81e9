/**
 * `allocate <key>` and `release <key>`.
 *
 * The CLI is a node only while it runs. `allocate` makes sure the key has its cluster-wide ID
 * (creating it if no node has one) and references it in the name of `--node` (by default a name of
 * its own, `cli-<host>-<pid>-<random>`). That reference is bound to the run's lease: without `--hold` it
 * stays after the process exits until the lease lapses (`--lease-ttl` after its last renewal;
 * on Deno KV other nodes wait `--clock-skew` longer), and the ID then lives on only while some
 * other node references the key (GC collects it two passes later otherwise). With `--hold` the
 * CLI keeps the lease alive until Ctrl-C, following the key if its ID moves, then releases it,
 * like a node that stops using it.
 *
 * A `--node` whose lease is live (a running node, or a run that exited within its lease TTL) is
 * refused (exit 4): two writers under one name would share its references and lease record.
 *
 * A fresh process holds nothing to release, so `release <key> --node <name>` is the operator's
 * tool: it deletes that node's reference to the key from the store directly (no lease is taken in
 * the node's name). Other nodes' references and the ID's master stay. It refuses (exit 4) the
 * reference of a live node (on etcd: one bound to a lease, which exists only while the lease
 * lives), saying until when its lease runs: that would take the ID from under a node that may
 * still use it (a running one, or a run that exited within its lease TTL). It is for what dead
 * nodes left behind (Deno KV references GC has not swept yet, references written without a
 * lease).
 *
 * @module
 */
import { Allocator } from "../../allocator/allocator.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import type { RunContext } from "../context.ts";
import { errorLine, ExitCode } from "../exit.ts";
import {
  aborted,
  allocatorOptions,
  deadline,
  liveLease,
  liveNodeText,
  noteNewNamespace,
  printable,
  referenceNote,
  refuseLiveNode,
  reportNotFound,
  requireNamespace,
  WRITER_CONSEQUENCE,
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
  const refused = await refuseLiveNode(ctx, store, WRITER_CONSEQUENCE);
  if (refused !== undefined) return refused;
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
    if (!ctx.options.json) output.warn(await referenceNote(ctx, store));
    return ExitCode.Ok;
  }
  ctx.untimed();
  if (!ctx.options.json) output.warn(`holding ID ${id} as node ${node}; Ctrl-C releases it`);
  await output.flush();
  const held = new HeldKey(ctx, allocator, key, id);
  try {
    await aborted(ctx.interrupt);
    using grace = deadline(RELEASE_GRACE_MS);
    // The ID the key has now: a move the watch has not reported yet is reported first.
    held.moved(await allocator.get(key, { signal: grace }) ?? held.id);
    const { lastUse } = await allocator.release(key, { signal: grace });
    if (ctx.options.json) {
      output.out.line(JSON.stringify({ key, id: held.id, released: lastUse, node }));
    } else output.out.line(`released ID ${held.id} for ${printable(key)} (node ${node})`);
  } finally {
    await held.stop();
  }
  return ExitCode.Ok;
}

/**
 * The key `allocate --hold` holds, following the allocator's `reassigned` events: a held key
 * whose ID went to another key while this run could not prove its claim moves to a new ID, and
 * the run says so (stderr; a JSON line on stdout with `--json`) and releases that one at the end.
 */
class HeldKey {
  /** The ID the key has now. */
  id: number;
  readonly #ctx: RunContext;
  readonly #allocator: Allocator;
  readonly #key: string;
  readonly #stop = new AbortController();
  readonly #follow: Promise<void>;

  constructor(ctx: RunContext, allocator: Allocator, key: string, id: number) {
    this.#ctx = ctx;
    this.#allocator = allocator;
    this.#key = key;
    this.id = id;
    this.#follow = this.#followMoves();
  }

  async #followMoves(): Promise<void> {
    try {
      for await (const event of this.#allocator.watch({ signal: this.#stop.signal })) {
        if (event.type === "reassigned" && event.key === this.#key) this.moved(event.newId);
      }
    } catch {
      // Stopped, or the allocator closed: the release reports the ID the key has then.
    }
  }

  /** Reports a move of the key to `id` unless it has that ID already. */
  moved(id: number): void {
    if (id === this.id) return;
    const oldId = this.id;
    this.id = id;
    const reason = moveReason(this.#allocator, this.#key, oldId);
    const { output, options } = this.#ctx;
    const node = this.#allocator.status().session.node;
    if (options.json) {
      output.out.line(
        JSON.stringify({ key: this.#key, id, oldId, reassigned: true, reason, node }),
      );
      void output.out.flush().catch(() => {});
    } else {
      output.warn(
        `${printable(this.#key)} moved from ID ${oldId} to ID ${id} (${reason}); ` +
          `now holding ID ${id}`,
      );
    }
  }

  /** Stops following. */
  async stop(): Promise<void> {
    this.#stop.abort();
    await this.#follow;
  }
}

/** Why a held key left `oldId`, from the fence's last reason and who has `oldId` now. */
function moveReason(allocator: Allocator, key: string, oldId: number): string {
  const other = allocator.cachedKey(oldId);
  const taken = other !== undefined && other !== key
    ? `the store gave ID ${oldId} to ${printable(other)}`
    : `the store no longer had ID ${oldId} for it`;
  switch (allocator.status().fence.lastReason) {
    case "lease lapsed":
      return `this run's lease lapsed before it could be renewed, and ${taken}`;
    case "lease replaced":
      return `this run's lease was lost or replaced, and ${taken}`;
    default:
      return taken;
  }
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
    // Refused, not failed: say who holds it, until when, and what to do instead. The node may
    // be running, or be a run that exited and whose lease has not lapsed yet.
    const lease = await liveLease(ctx, store, node).catch(() => undefined);
    const live = lease === undefined ? `node ${node} is live` : liveNodeText(store, lease);
    const what =
      `${live}: its reference to ${printable(key)}${
        id === undefined ? "" : ` (ID ${id})`
      } stays while its lease does, as the node may still use the ID. If ${node} is running, ` +
      "release the key there or stop it; if it has exited, its lease lapses then (it is not " +
      "renewed any more) and release --node deletes what is left";
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
