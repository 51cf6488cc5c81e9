/**
 * `identity allocate <labels…>` and `identity list`: Cilium-style security identities. Label sets
 * are written as Cilium prints them (`k8s:app=web`, `reserved:host`, `cidr:10.0.0.0/8`); the store
 * holds Cilium's kvstore strings (`k8s:app=web;`).
 *
 * `identity get <id>` prints one identity's labels (reserved ones without the store).
 *
 * `identity release <labels…> --node <name>` deletes that node's reference to the label set's
 * identity: `release` of the label set's key (the identity stays until GC).
 *
 * Reserved label sets map to their fixed IDs and node-local ones (CIDR, FQDN) to IDs that exist
 * only inside the allocating process; neither touches the store. Everything else gets a global
 * identity in `--cluster-id`'s range, held like `allocate` holds a key.
 *
 * @module
 */
import {
  hasLocalScope,
  hasRemoteNodeScope,
  IdentityAllocator,
  Labels,
  labelsCodec,
  requiresGlobalIdentity,
  ReservedIdentities,
} from "../../identity/mod.ts";
import { InvalidOptionsError } from "../../errors.ts";
import { parseIdArgument } from "../args.ts";
import { releaseCommand } from "./allocate.ts";
import type { RunContext } from "../context.ts";
import { ExitCode } from "../exit.ts";
import { writeTable } from "../table.ts";
import {
  aborted,
  deadline,
  listStore,
  noteNewNamespace,
  notFound,
  plural,
  printable,
  referenceNote,
  refuseLiveNode,
  reportNotFound,
  WRITER_CONSEQUENCE,
} from "./common.ts";

/** Options of `identity allocate`. */
export interface IdentityAllocateOptions {
  /** This cluster's ID (its global identities' range). */
  readonly clusterId: number;
  /** This cluster's name (well-known identities' labels). */
  readonly clusterName: string;
  /** Keep the identity until interrupted, then release it. */
  readonly hold: boolean;
}

/** Options of `identity list`. */
export interface IdentityListOptions {
  /** This cluster's name (well-known identities' labels). */
  readonly clusterName: string;
  /** Also list the reserved and well-known identities (never stored). */
  readonly reserved: boolean;
}

const RELEASE_GRACE_MS = 10_000;

function scopeOf(identities: IdentityAllocator, id: number): string {
  if (identities.reserved.isReserved(id)) return "reserved";
  if (hasLocalScope(id) || hasRemoteNodeScope(id)) return "node-local";
  return "global";
}

/**
 * `identity release <labels…> --node <name>`: node `--node`'s reference to the identity of the
 * label set, deleted as `release` deletes a key's (refused while that node is live). Reserved and
 * node-local label sets have no identity in the store.
 */
export async function identityReleaseCommand(
  ctx: RunContext,
  labelTexts: readonly string[],
): Promise<number> {
  const labels = Labels.parse(labelTexts);
  if (!requiresGlobalIdentity(labels)) {
    throw new InvalidOptionsError(
      `${labels} has no identity in the store (reserved or node-local): nothing to release`,
    );
  }
  return await releaseCommand(ctx, labelsCodec.encode(labels));
}

/** `identity allocate <labels…> [--hold]`. */
export async function identityAllocateCommand(
  ctx: RunContext,
  labelTexts: readonly string[],
  options: IdentityAllocateOptions,
): Promise<number> {
  const { output } = ctx;
  // The library's one label parser: a label with an empty key (`=x`, `k8s:`) is refused, naming it.
  const labels = Labels.parse(labelTexts);
  const store = await ctx.store(true);
  const refused = await refuseLiveNode(ctx, store, WRITER_CONSEQUENCE);
  if (refused !== undefined) return refused;
  await noteNewNamespace(ctx, store);
  await using identities = await IdentityAllocator.open(store.backend, {
    clusterId: options.clusterId,
    clusterName: options.clusterName,
    leaseTtlMs: ctx.options.leaseTtlMs,
  }, { signal: ctx.signal });
  const { identity, isNew } = await identities.allocate(labels, { signal: ctx.signal });
  const scope = scopeOf(identities, identity.id);
  const node = store.backend.node;
  if (ctx.options.json) {
    output.out.line(JSON.stringify({
      id: identity.id,
      labels: identity.labels.toJSON(),
      scope,
      isNew,
      node,
    }));
  } else {
    output.out.line(
      `identity ${identity.id} for ${identity.labels} (${scope}${
        scope === "global" ? `, ${isNew ? "created" : "existing"}` : ""
      })`,
    );
    if (scope === "node-local") {
      output.warn("note: node-local identities live inside the allocating process only");
    } else if (scope === "global" && !options.hold) {
      output.warn(await referenceNote(ctx, store));
    }
  }
  if (!options.hold) return ExitCode.Ok;
  ctx.untimed();
  if (!ctx.options.json) output.warn(`holding identity ${identity.id}; Ctrl-C releases it`);
  await output.flush();
  await aborted(ctx.interrupt);
  using grace = deadline(RELEASE_GRACE_MS);
  // The identity the labels have now: a held one whose ID went to other labels has moved.
  const held = await identities.resolve(identity.labels, { signal: grace }) ?? identity;
  if (held.id !== identity.id && !ctx.options.json) {
    output.warn(`${identity.labels} moved from identity ${identity.id} to ${held.id}`);
  }
  const lastUse = await identities.release(held, { signal: grace });
  if (ctx.options.json) {
    output.out.line(JSON.stringify({ id: held.id, released: lastUse, node }));
  } else output.out.line(`released identity ${held.id}`);
  return ExitCode.Ok;
}

/** Options of `identity get`. */
export interface IdentityGetOptions {
  /** This cluster's name (well-known identities' labels). */
  readonly clusterName: string;
}

/**
 * `identity get <id>`: the labels of one identity, like `cilium-dbg identity get`. Reserved and
 * well-known identities are answered without the store; node-local ones exist only inside the
 * process that allocated them, so the store cannot know them.
 */
export async function identityGetCommand(
  ctx: RunContext,
  text: string,
  options: IdentityGetOptions,
): Promise<number> {
  const { output } = ctx;
  const id = parseIdArgument(text);
  const print = (labels: Labels | string, scope: string) => {
    if (ctx.options.json) {
      output.out.line(JSON.stringify(
        typeof labels === "string"
          ? { id, key: labels, scope }
          : { id, labels: labels.toJSON(), scope },
      ));
    } else {
      writeTable(output.out, ["ID", "LABELS"], [[
        String(id),
        typeof labels === "string" ? `(not a label set) ${printable(labels)}` : labels.toString(),
      ]]);
    }
    return ExitCode.Ok;
  };
  const reserved = new ReservedIdentities({ clusterName: options.clusterName }).lookupById(id);
  if (reserved !== undefined) return print(reserved.labels, "reserved");
  if (hasLocalScope(id) || hasRemoteNodeScope(id)) {
    return reportNotFound(
      ctx,
      `identity ${id} is node-local: it exists only inside the process that allocated it`,
    );
  }
  const store = await ctx.store();
  const session = await store.reader(ctx.signal);
  const key = await session.getById(id, ctx.signal);
  if (key === undefined) return await notFound(ctx, store, `identity ${id} does not exist`);
  try {
    return print(labelsCodec.decode(key), "global");
  } catch {
    return print(key, "global");
  }
}

/** `identity list [--reserved]`. */
export async function identityListCommand(
  ctx: RunContext,
  options: IdentityListOptions,
): Promise<number> {
  const { output } = ctx;
  const { store, rows: masters, progress } = await listStore(ctx, "identities");
  const rows: Array<[number, Labels | string]> = [];
  let foreign = 0;
  if (options.reserved) {
    const reserved = new ReservedIdentities({ clusterName: options.clusterName });
    for (const { id, labels } of reserved) rows.push([id, labels]);
  }
  for (const [id, key] of masters) {
    try {
      rows.push([id, labelsCodec.decode(key)]);
    } catch {
      foreign++;
      rows.push([id, key]);
    }
  }
  rows.sort((a, b) => a[0] - b[0]);
  progress.done(`listed ${plural(masters.length, "identity", "identities")}`);
  if (ctx.options.json) {
    output.out.write("[");
    rows.forEach(([id, labels], i) => {
      const entry = typeof labels === "string"
        ? { id, key: labels }
        : { id, labels: labels.toJSON() };
      output.out.write(`${i === 0 ? "\n" : ",\n"}${JSON.stringify(entry)}`);
    });
    output.out.line(rows.length === 0 ? "]" : "\n]");
  } else {
    writeTable(
      output.out,
      ["ID", "LABELS"],
      rows.map(([id, labels]) => [
        String(id),
        typeof labels === "string" ? `(not a label set) ${printable(labels)}` : labels.toString(),
      ]),
    );
    output.err.line(
      `${plural(masters.length, "identity", "identities")} under prefix ${store.prefix} in ` +
        `${store.where}` +
        (foreign > 0 ? ` (${plural(foreign, "key is", "keys are")} not label sets)` : ""),
    );
  }
  return ExitCode.Ok;
}
