/**
 * The damage report on etcd ({@linkcode StoreDoctor}): a paged read of the masters and of the
 * references, reporting entries idalloc (and Cilium) cannot use, and a guarded delete of one.
 *
 * Reported: masters with a non-numeric ID, an empty value, a value that is not UTF-8, or a key
 * the layout cannot hold (too large for a request, moved out of `value/` by Go's path cleaning,
 * or an entry that alone exceeds a response); references whose key has no `<key>/<node>` shape,
 * whose value is not a decimal ID, that are bound to no lease (they would never expire), or (with
 * valid ranges) that name an ID outside every one of them. Other keys under the prefix (Cilium's
 * `locks/`) are not looked at.
 *
 * Each finding names the live nodes that hold it: an entry bound to a lease is held by that lease
 * (etcd deletes it when the lease ends, so a stored one is live), and a master by the nodes whose
 * references name its ID. A removal is one transaction: delete the key if its mod revision is
 * still the listed one and it is bound to no lease; a leased entry is refused with
 * {@linkcode LiveEntryError}.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a client of a running etcd (tests/backends/etcd/garbage.test.ts runs it)
 * for await (const f of findDamage(client, layout, { range: { min: 256, max: 65535 } })) {
 *   if (f.kind === "reference-without-lease") await removeDamage(client, layout, f, signal);
 * }
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { IKeyValue } from "../../deps/etcd3.ts";
import { z } from "../../deps/zod.ts";
import {
  type DamageFinding,
  type DamageKind,
  type DamageScanOptions,
  decodeToken,
  encodeToken,
  heldBy,
  LiveUse,
  type RangeCheck,
  rangeCheck,
  shorten,
} from "../../allocator/damage.ts";
import { InvalidOptionsError, LiveEntryError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { bytes, type EtcdClient } from "./client.ts";
import { rangePages } from "./paging.ts";
import { type EtcdLayout, keyProblem, parseId } from "./layout.ts";
import { kvsAt, prefixRange, strictText, text } from "./txn.ts";

const log = idallocLogger("etcd", "doctor");

/** The token's backend tag. */
const TAG = "etcd";

const tokenSchema = z.object({
  key: z.string().regex(/^[A-Za-z0-9+/]*={0,2}$/).min(1),
  mod: z.string().regex(/^[0-9]+$/),
  kind: z.string(),
  /** The holders the listing found (see `heldBy`): such a token is never acted on. */
  held: z.array(z.string()).optional(),
});

/** A finding before its holders are known, with what decides them. */
interface Pending {
  readonly finding: DamageFinding;
  /** The entry's own lease (`"0"` for none): etcd deletes the entry when it ends. */
  readonly lease: string;
  /** A master's ID: its holders are the nodes whose live references name it. */
  readonly masterId?: number;
}

/** What is wrong with one entry, before it becomes a finding. */
export interface Damage {
  readonly kind: DamageKind;
  readonly reason: string;
  readonly about?: About;
}

/** What one reference entry is: its parts (when its key has the shape), live use, damage. */
export interface ReferenceVerdict {
  /** The reference's key and node, when its etcd key is `<key>/<node>`. */
  readonly parts?: { readonly key: string; readonly node: string };
  /** A well-formed reference on a lease: a live one, its node uses the ID. */
  readonly live?: { readonly key: string; readonly node: string; readonly id: number };
  readonly damage?: Damage;
}

/**
 * Lists every damaged master and reference under the layout's prefix (see the module doc), each
 * with the live nodes that hold it ({@linkcode DamageFinding.heldBy}): the entry's own lease
 * (every stored reference on a lease is live: etcd deletes a lease's keys when it ends), and for a
 * master the nodes whose references name its ID. Masters are reported after the references were
 * read, as their holders are known only then.
 */
export async function* findDamage(
  client: EtcdClient,
  layout: EtcdLayout,
  options: DamageScanOptions = {},
): AsyncGenerator<DamageFinding> {
  const signal = options.signal ?? new AbortController().signal;
  const check = rangeCheck(options);
  const pages = (prefix: string) =>
    rangePages(client, "doctor list", prefixRange(prefix), signal, { onCompacted: "resume" });
  const use = new LiveUse();
  const masters: Pending[] = [];
  for await (const page of pages(layout.masterRange)) {
    for (const kv of page.tooLarge) masters.push(pending(kv, oversizedMaster(layout, kv), true));
    for (const kv of page.kvs) {
      const damage = masterDamage(layout, kv);
      if (damage !== undefined) masters.push(pending(kv, damage, true));
    }
  }
  for (const { masterId } of masters) if (masterId !== undefined) use.watchId(masterId);

  // The nodes behind each lease, to name the holder of a leased entry that names no node itself.
  const nodesOfLease = new Map<string, Set<string>>();
  const references: Pending[] = [];
  for await (const page of pages(layout.valuePrefix + "/")) {
    for (const kv of page.tooLarge) {
      references.push(pending(kv, { kind: "reference-undecodable", reason: TOO_LARGE }));
    }
    for (const kv of page.kvs) {
      const verdict = referenceDamage(layout, kv, check);
      const lease = String(kv.lease);
      if (verdict.parts !== undefined && lease !== "0") {
        let nodes = nodesOfLease.get(lease);
        if (nodes === undefined) nodesOfLease.set(lease, nodes = new Set());
        nodes.add(verdict.parts.node);
      }
      if (verdict.live !== undefined) use.note(verdict.live);
      if (verdict.damage !== undefined) references.push(pending(kv, verdict.damage));
    }
  }

  const holdersOfLease = (lease: string): string[] =>
    lease === "0" ? [] : [...nodesOfLease.get(lease) ?? [leaseName(lease)]];
  for (const p of [...masters, ...references]) {
    const byId = p.masterId === undefined ? [] : use.holdersOfId(p.masterId);
    yield heldBy(p.finding, [...holdersOfLease(p.lease), ...byId]);
  }
}

const TOO_LARGE = "the entry alone exceeds a response";

/** A finding of a master (`master`: its holders include the nodes that name its ID) or reference. */
function pending(kv: IKeyValue, damage: Damage, master = false): Pending {
  return {
    finding: finding(kv.key, kv, damage.kind, damage.reason, damage.about),
    lease: String(kv.lease),
    masterId: master ? damage.about?.id : undefined,
  };
}

/** A master entry that alone exceeds a response (its value was not read). */
function oversizedMaster(layout: EtcdLayout, kv: IKeyValue): Damage {
  const about = { id: layout.idOfMasterKey(text(kv.key)) };
  return { kind: "master-oversized", reason: TOO_LARGE, about };
}

/** What is wrong with a listed master, if anything (see the module doc). */
export function masterDamage(layout: EtcdLayout, kv: IKeyValue): Damage | undefined {
  const id = layout.idOfMasterKey(text(kv.key));
  if (id === undefined) {
    return { kind: "master-bad-id", reason: "the ID is not a decimal safe integer" };
  }
  const key = strictText(kv.value);
  if (key === undefined) {
    return { kind: "master-undecodable", reason: "the value is not UTF-8", about: { id } };
  }
  if (key === "") return { kind: "master-empty", reason: "the value is empty", about: { id } };
  const problem = keyProblem(layout, key);
  if (problem === undefined) return undefined;
  const reason = `its key cannot be stored: ${problem}`;
  return { kind: "master-oversized", reason, about: { id, key } };
}

/** What a listed reference is (see {@linkcode ReferenceVerdict}), judged against `check`. */
export function referenceDamage(
  layout: EtcdLayout,
  kv: IKeyValue,
  check: RangeCheck | undefined,
): ReferenceVerdict {
  const parts = layout.splitRefKey(text(kv.key));
  if (parts === undefined || parts.key === "" || parts.node === "") {
    return { damage: { kind: "reference-bad-key", reason: "not a <key>/<node> reference key" } };
  }
  const { key, node } = parts;
  const id = parseId(text(kv.value));
  const about = { key, node, id };
  if (id === undefined) {
    const reason = "the value is not a decimal ID";
    return { parts, damage: { kind: "reference-undecodable", reason, about } };
  }
  if (String(kv.lease) === "0") {
    const reason = "it is bound to no lease";
    return { parts, damage: { kind: "reference-without-lease", reason, about } };
  }
  // A stored reference on a lease is a live one: its node uses the ID.
  const live = { key, node, id };
  if (check === undefined || check.valid(id, key)) return { parts, live };
  const damage = { kind: "reference-out-of-range", reason: check.outside(id, key), about };
  return { parts, live, damage };
}

/** A lease as etcd's tools print it (`etcdctl lease list`): hexadecimal. */
function leaseName(lease: string): string {
  return `lease ${BigInt(lease).toString(16)}`;
}

/**
 * Deletes the entry of `finding` if its mod revision is still the listed one and it is bound to
 * no lease. Returns whether it deleted. Throws {@linkcode LiveEntryError} for an entry the listing
 * found held, or one on a lease now (it exists, so the lease is live: etcd deletes a lease's keys
 * when it ends), and {@linkcode InvalidOptionsError} for a token not issued for this prefix.
 *
 * A master that live references name was reported held by the listing; between the listing and
 * this call a node can only come to name a corrupt master's ID by repairing the master, which
 * changes its mod revision, so the guard keeps it.
 */
export async function removeDamage(
  client: EtcdClient,
  layout: EtcdLayout,
  finding: Pick<DamageFinding, "token">,
  signal: AbortSignal,
): Promise<boolean> {
  const parsed = tokenSchema.safeParse(decodeToken(finding.token, TAG));
  if (!parsed.success) {
    throw new InvalidOptionsError("not a damage token of an etcd store", { cause: parsed.error });
  }
  const key = Buffer.from(parsed.data.key, "base64");
  const under = (prefix: string) => key.subarray(0, bytes(prefix).length).equals(bytes(prefix));
  if (!under(layout.masterRange) && !under(layout.valuePrefix + "/")) {
    throw new InvalidOptionsError(
      `damage token names '${shorten(text(key))}', not a master or reference of this prefix`,
    );
  }
  if (parsed.data.held !== undefined) {
    throw new LiveEntryError(shorten(text(key)), parsed.data.held);
  }
  // Raw bytes, not text: an entry whose key is not UTF-8 is removable too.
  const res = await client.call("doctor remove", signal, (o) =>
    client.raw.kv.txn({
      compare: [
        { key, target: "Mod", result: "Equal", mod_revision: parsed.data.mod },
        { key, target: "Lease", result: "Equal", lease: 0 },
      ],
      success: [{ request_delete_range: { key } }],
      failure: [{ request_range: { key } }],
    }, o));
  const entry = shorten(text(key));
  if (!res.succeeded) {
    const now = kvsAt(res.responses, 0)[0];
    if (now !== undefined && String(now.mod_revision) === parsed.data.mod) {
      const node = layout.splitRefKey(text(key))?.node;
      const lease = leaseName(String(now.lease));
      log.info("kept damaged entry {key} ({kind}): held by {lease}", {
        key: entry,
        kind: parsed.data.kind,
        lease,
      });
      throw new LiveEntryError(`${entry} (on ${lease})`, [node ?? lease]);
    }
  }
  log.info("{what} damaged entry {key} ({kind})", {
    what: res.succeeded ? "removed" : "entry changed since it was listed; kept",
    key: entry,
    kind: parsed.data.kind,
  });
  return res.succeeded;
}

/** What a finding says about its entry. */
export type About = {
  readonly id?: number | undefined;
  readonly key?: string;
  readonly node?: string;
};

function finding(
  etcdKey: Uint8Array,
  kv: IKeyValue,
  kind: DamageKind,
  reason: string,
  about: About = {},
): DamageFinding {
  return {
    kind,
    entry: shorten(text(etcdKey)),
    reason: shorten(reason),
    ...(about.id === undefined ? {} : { id: about.id }),
    ...(about.key === undefined ? {} : { key: shorten(about.key) }),
    ...(about.node === undefined ? {} : { node: shorten(about.node) }),
    token: encodeToken(TAG, {
      key: Buffer.from(etcdKey).toString("base64"),
      mod: String(kv.mod_revision),
      kind,
    }),
  };
}
