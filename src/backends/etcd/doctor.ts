/**
 * The damage report on etcd ({@linkcode StoreDoctor}): a paged read of the masters and of the
 * references, reporting entries idalloc (and Cilium) cannot use, and a guarded delete of one.
 *
 * Reported: masters with a non-numeric ID, an empty value, a value that is not UTF-8, or a key
 * the layout cannot hold (too large for a request, moved out of `value/` by Go's path cleaning,
 * or an entry that alone exceeds a response); references whose key has no `<key>/<node>` shape,
 * whose value is not a decimal ID, that are bound to no lease (they would never expire), or (with a
 * range) that name an ID outside it. Other keys under the prefix (Cilium's `locks/`) are not
 * looked at.
 *
 * A removal is one transaction: delete the key if its mod revision is still the listed one.
 *
 * @example
 * ```ts ignore
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
  shorten,
} from "../../allocator/damage.ts";
import { InvalidOptionsError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import { bytes, type EtcdClient } from "./client.ts";
import { keyProblem } from "./key_check.ts";
import { rangePages } from "./paging.ts";
import { type EtcdLayout, parseId } from "./paths.ts";
import { prefixRange, strictText, text } from "./txn.ts";

const log = idallocLogger("etcd", "doctor");

/** The token's backend tag. */
const TAG = "etcd";

const tokenSchema = z.object({
  key: z.string().regex(/^[A-Za-z0-9+/]*={0,2}$/).min(1),
  mod: z.string().regex(/^[0-9]+$/),
  kind: z.string(),
});

/** Lists every damaged master and reference under the layout's prefix (see the module doc). */
export async function* findDamage(
  client: EtcdClient,
  layout: EtcdLayout,
  options: DamageScanOptions = {},
): AsyncGenerator<DamageFinding> {
  const signal = options.signal ?? new AbortController().signal;
  const range = options.range;
  const pages = (prefix: string) =>
    rangePages(client, "doctor list", prefixRange(prefix), signal, { onCompacted: "resume" });

  for await (const page of pages(layout.masterRange)) {
    for (const kv of page.tooLarge) {
      yield finding(kv.key, kv, "master-oversized", "the entry alone exceeds a response", {
        id: layout.idOfMasterKey(text(kv.key)),
      });
    }
    for (const kv of page.kvs) {
      const id = layout.idOfMasterKey(text(kv.key));
      if (id === undefined) {
        yield finding(kv.key, kv, "master-bad-id", "the ID is not a decimal safe integer");
        continue;
      }
      const key = strictText(kv.value);
      if (key === undefined) {
        yield finding(kv.key, kv, "master-undecodable", "the value is not UTF-8", { id });
        continue;
      }
      if (key === "") {
        yield finding(kv.key, kv, "master-empty", "the value is empty", { id });
        continue;
      }
      const problem = keyProblem(layout, key);
      if (problem !== undefined) {
        yield finding(kv.key, kv, "master-oversized", `its key cannot be stored: ${problem}`, {
          id,
          key,
        });
      }
    }
  }

  for await (const page of pages(layout.valuePrefix + "/")) {
    for (const kv of page.tooLarge) {
      yield finding(kv.key, kv, "reference-undecodable", "the entry alone exceeds a response");
    }
    for (const kv of page.kvs) {
      const parts = layout.splitRefKey(text(kv.key));
      if (parts === undefined || parts.key === "" || parts.node === "") {
        yield finding(kv.key, kv, "reference-bad-key", "not a <key>/<node> reference key");
        continue;
      }
      const id = parseId(text(kv.value));
      const about = { key: parts.key, id };
      if (id === undefined) {
        yield finding(kv.key, kv, "reference-undecodable", "the value is not a decimal ID", about);
      } else if (String(kv.lease) === "0") {
        yield finding(kv.key, kv, "reference-without-lease", "it is bound to no lease", about);
      } else if (range !== undefined && (id < range.min || id > range.max)) {
        yield finding(kv.key, kv, "reference-out-of-range", `ID ${id} is outside the range`, about);
      }
    }
  }
}

/**
 * Deletes the entry of `finding` if its mod revision is still the listed one. Returns whether it
 * deleted. Throws {@linkcode InvalidOptionsError} for a token not issued for this prefix.
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
  // Raw bytes, not text: an entry whose key is not UTF-8 is removable too.
  const res = await client.call("doctor remove", signal, (o) =>
    client.raw.kv.txn({
      compare: [{ key, target: "Mod", result: "Equal", mod_revision: parsed.data.mod }],
      success: [{ request_delete_range: { key } }],
      failure: [],
    }, o));
  log.info("{what} damaged entry {key} ({kind})", {
    what: res.succeeded ? "removed" : "entry changed since it was listed; kept",
    key: shorten(text(key)),
    kind: parsed.data.kind,
  });
  return res.succeeded;
}

function finding(
  etcdKey: Uint8Array,
  kv: IKeyValue,
  kind: DamageKind,
  reason: string,
  about: { readonly id?: number | undefined; readonly key?: string } = {},
): DamageFinding {
  return {
    kind,
    entry: shorten(text(etcdKey)),
    reason: shorten(reason),
    ...(about.id === undefined ? {} : { id: about.id }),
    ...(about.key === undefined ? {} : { key: shorten(about.key) }),
    token: encodeToken(TAG, {
      key: Buffer.from(etcdKey).toString("base64"),
      mod: String(kv.mod_revision),
      kind,
    }),
  };
}
