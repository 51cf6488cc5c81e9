/**
 * Paginated range reads: every page at the first page's revision, pages sized by bytes.
 *
 * etcd 3.4 walks and counts the whole rest of the range on every request that has a `limit`, so
 * listing N keys in pages of P keys costs O(N²/P): pages must be large (100,000 masters in pages
 * of 256 took ~15 s). But a value may be ~97 KB, so a fixed large page could outgrow the response
 * limit. The first page holds only as many keys as fit the byte target even at the largest
 * value; each next page holds as many as fit it at the average size of the page before, up to
 * {@linkcode MAX_PAGE_KEYS}; a page the client refuses as too large is asked again with fewer
 * keys, and later pages grow back gradually. An entry that alone exceeds the limit does not end
 * the read: its key is fetched without its value and reported in {@linkcode RangePage.tooLarge},
 * and the read goes on after it.
 *
 * @example
 * ```ts
 * import type { EtcdClient } from "./client.ts";
 * import { rangePages } from "./paging.ts";
 * import { EtcdLayout } from "./layout.ts";
 * import { prefixRange } from "./txn.ts";
 *
 * // Needs a client of a running etcd: a function here, so that it is type-checked.
 * async function countMasters(client: EtcdClient, signal: AbortSignal): Promise<number> {
 *   const { masterRange } = new EtcdLayout("cilium/state/identities/v1");
 *   let masters = 0;
 *   for await (const page of rangePages(client, "list masters", prefixRange(masterRange), signal)) {
 *     masters += page.kvs.length; // every page is read at the first page's revision
 *   }
 *   return masters;
 * }
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { IKeyValue } from "../../deps/etcd3.ts";
import { IdallocError } from "../../errors.ts";
import { type EtcdClient, ResponseTooLarge } from "./client.ts";
import { MAX_KEY_BYTES } from "./limits.ts";
import type { ByteRange } from "./txn.ts";

/** The most keys one page asks for: the count etcd 3.4 redoes per page is what this amortizes. */
export const MAX_PAGE_KEYS = 8192;
/** Bytes a page aims at: half of gRPC's default 4 MiB receive limit (ours is higher still). */
export const PAGE_TARGET_BYTES = 2 * 1024 * 1024;
/** Bytes of a key-value's protobuf framing and revisions beside its key and value (generous). */
const KV_OVERHEAD_BYTES = 64;
/** A key of the largest possible value, for sizing the first page: its value and a long key. */
const LARGEST_KV_BYTES = MAX_KEY_BYTES + 1024 + KV_OVERHEAD_BYTES;

/** One page of a range read. */
export interface RangePage {
  /** The page's key-values, in key order. */
  readonly kvs: readonly IKeyValue[];
  /** The revision the page is served at: the first page's (after a `resume`, the new one's). */
  readonly revision: string;
  /**
   * Entries skipped because each alone exceeds the response limit, read without their values
   * (key and revisions only). They come after the page's `kvs` in key order.
   */
  readonly tooLarge: readonly IKeyValue[];
}

/** Options of {@linkcode rangePages}. */
export interface PagingOptions {
  /**
   * What to do when the pinned revision is compacted between two pages: `throw`
   * {@linkcode RevisionCompacted} (the caller re-lists), or `resume` from the next key at the
   * then current revision (a caller that verifies each entry later, like GC). @default {"throw"}
   */
  readonly onCompacted?: "throw" | "resume";
}

/** The revision a paged read was pinned to was compacted away. Internal. */
export class RevisionCompacted extends Error {
  /** @param cause the client's error */
  constructor(cause: unknown) {
    super("the revision of a paged read was compacted", { cause });
    this.name = "RevisionCompacted";
  }
}

function compacted(err: unknown): boolean {
  return err instanceof Error && /compacted/i.test(err.message);
}

/** The byte target of pages under `client`'s receive limit. */
export function pageTargetBytes(client: EtcdClient): number {
  return Math.min(PAGE_TARGET_BYTES, Math.floor(client.maxResponseBytes / 4));
}

/** How many keys fit `targetBytes` at `bytesPerKey`, within `[1, MAX_PAGE_KEYS]`. */
export function keysFor(targetBytes: number, bytesPerKey: number): number {
  return Math.max(1, Math.min(MAX_PAGE_KEYS, Math.floor(targetBytes / Math.max(1, bytesPerKey))));
}

/** The limit to ask again with after `limit` keys came back as `err`. */
function shrunk(limit: number, err: ResponseTooLarge): number {
  const half = Math.floor(limit / 2);
  if (err.size === undefined || err.max === undefined || err.size <= 0) return half;
  // Aim at a quarter of the limit at the refused page's average: one retry, rarely two.
  return Math.min(half, Math.floor((limit * err.max) / err.size / 4));
}

/**
 * The pages of `range` in key order, all at the first page's revision (see the module doc).
 * Ends after the last page; an empty range yields one empty page.
 */
export async function* rangePages(
  client: EtcdClient,
  what: string,
  range: ByteRange,
  signal: AbortSignal,
  options: PagingOptions = {},
): AsyncGenerator<RangePage> {
  const target = pageTargetBytes(client);
  let limit = keysFor(target, LARGEST_KV_BYTES);
  // After a refusal, pages grow back at most twofold per page: values come in runs (a
  // cluster's keys), so the average of small ones must not size a page that reaches big ones.
  let cap = MAX_PAGE_KEYS;
  let revision: string | undefined;
  let start: Buffer = range.key;
  // Set after a single entry was refused: the next request reads it without its value.
  let keysOnly = false;
  for (;;) {
    let page;
    try {
      page = await client.call(what, signal, (o) =>
        client.raw.kv.range({
          key: start,
          range_end: range.range_end,
          limit,
          revision: revision ?? 0,
          keys_only: keysOnly,
          sort_order: "Ascend",
          sort_target: "Key",
        }, o));
    } catch (err) {
      if (err instanceof ResponseTooLarge) {
        if (keysOnly) {
          throw new IdallocError(`etcd ${what} failed: one key exceeds the response limit`, {
            cause: err,
          });
        }
        // One entry alone is over the limit: read its key without its value, and step over it.
        if (limit <= 1) keysOnly = true;
        else limit = Math.max(1, shrunk(limit, err));
        cap = limit;
        continue;
      }
      if (revision !== undefined && compacted(err)) {
        if (options.onCompacted !== "resume") throw new RevisionCompacted(err);
        revision = undefined;
        continue;
      }
      throw err;
    }
    revision ??= String(page.header.revision);
    const kvs = page.kvs;
    yield keysOnly ? { kvs: [], revision, tooLarge: kvs } : { kvs, revision, tooLarge: [] };
    if (!page.more || kvs.length === 0) return;
    if (!keysOnly) {
      let bytes = 0;
      for (const kv of kvs) bytes += kv.key.length + kv.value.length + KV_OVERHEAD_BYTES;
      cap = Math.min(MAX_PAGE_KEYS, cap * 2);
      limit = Math.min(cap, keysFor(target, bytes / kvs.length));
    }
    keysOnly = false;
    start = Buffer.concat([kvs[kvs.length - 1].key, Buffer.from([0])]);
  }
}
