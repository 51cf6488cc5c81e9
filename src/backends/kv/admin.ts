/**
 * The Deno KV backend's {@linkcode BackendAdmin}: the operator's view of the layout (namespaces,
 * lease records, references and their liveness), judged by the same rules as the sessions
 * (`liveness.ts`), so that the CLI never rebuilds them.
 *
 * @module
 */
import type { BackendAdmin, NodeLease, StoredReference } from "../../allocator/admin.ts";
import { LiveEntryError } from "../../errors.ts";
import { commit, get, list, newStats } from "./client.ts";
import type { KvContext } from "./context.ts";
import { isExpired, isLive, nodeIsLive, readLeases } from "./liveness.ts";
import { corrupt, decode } from "./schema.ts";

/** Entries read per step when looking for other namespaces, and steps at most. */
const SCAN_BATCH = 200;
const SCAN_STEPS = 25;
/** References whose node leases are looked up together. */
const REF_BATCH = 500;

/** A Deno KV prefix as an operator types it: `a/b`, or JSON when that would be ambiguous. */
export function formatKvPrefix(prefix: readonly Deno.KvKeyPart[]): string {
  const plain = prefix.every((p) => typeof p === "string" && p !== "" && !p.includes("/"));
  return plain && !String(prefix[0]).startsWith("[")
    ? prefix.join("/")
    : JSON.stringify(prefix, (_, v) => typeof v === "bigint" ? `${v}n` : v);
}

/** The namespace a key of this layout lives in, if its last parts reveal one. */
function namespaceOf(key: Deno.KvKey): Deno.KvKey | undefined {
  const n = key.length;
  if (n >= 2 && key[n - 1] === "gen") return key.slice(0, n - 1);
  if (n >= 3 && key[n - 2] === "id" && typeof key[n - 1] === "number") return key.slice(0, n - 2);
  if (n >= 3 && key[n - 2] === "lease" && typeof key[n - 1] === "string") {
    return key.slice(0, n - 2);
  }
  return undefined;
}

/** The Deno KV implementation of {@linkcode BackendAdmin}. */
export class KvAdmin implements BackendAdmin {
  readonly #ctx: KvContext;
  readonly #stats;

  /** @param ctx the backend's store, layout and settings */
  constructor(ctx: KvContext) {
    this.#ctx = ctx;
    this.#stats = newStats(ctx.telemetry);
  }

  get namespace(): string {
    return formatKvPrefix(this.#ctx.layout.prefix);
  }

  async namespaceExists(signal: AbortSignal): Promise<boolean> {
    const { layout } = this.#ctx;
    if ((await get(this.#ctx, this.#stats, layout.gen(), signal)).versionstamp !== null) {
      return true;
    }
    for (const part of [layout.ids(), layout.leases(), layout.refs()]) {
      for await (const _ of list(this.#ctx, this.#stats, { prefix: part }, signal, 1)) return true;
    }
    return false;
  }

  async otherNamespaces(signal: AbortSignal, limit = 8): Promise<string[]> {
    const found = new Map<string, Deno.KvKey>();
    // A skip scan: find a key that reveals a namespace, then jump past that namespace.
    let selector: Deno.KvListSelector = { prefix: [] };
    for (let step = 0; step < SCAN_STEPS && found.size <= limit; step++) {
      let last: Deno.KvKey | undefined;
      let next: Deno.KvListSelector | undefined;
      for await (
        const entry of list(this.#ctx, this.#stats, selector, signal, SCAN_BATCH)
      ) {
        last = entry.key;
        const ns = namespaceOf(entry.key);
        if (ns) {
          found.set(JSON.stringify(ns), ns);
          // `true` sorts after every string and number part: the end of this namespace.
          next = { start: [...ns, true], end: [true] };
          break;
        }
      }
      if (last === undefined) break;
      selector = next ?? { start: [...last, new Uint8Array(0)], end: [true] };
    }
    const own = JSON.stringify(this.#ctx.layout.prefix);
    return [...found.entries()]
      .filter(([k]) => k !== own)
      .slice(0, limit)
      .map(([, ns]) => formatKvPrefix(ns));
  }

  async nodeLeases(signal: AbortSignal): Promise<NodeLease[]> {
    const { layout, settings } = this.#ctx;
    const now = settings.now();
    const out: NodeLease[] = [];
    for await (const entry of list(this.#ctx, this.#stats, { prefix: layout.leases() }, signal)) {
      const node = layout.parseLease(entry.key);
      if (node === undefined) {
        corrupt(entry.key, "not a lease key");
        continue;
      }
      const value = decode.lease(entry);
      if (value === undefined) continue;
      out.push({
        node,
        expiresAt: value.expiresAt,
        live: !isExpired(value, now, settings.maxClockSkewMs),
      });
    }
    return out;
  }

  async *references(signal: AbortSignal): AsyncGenerator<StoredReference> {
    const { layout } = this.#ctx;
    let batch: { key: string; node: string; id: number; lease: string }[] = [];
    for await (const entry of list(this.#ctx, this.#stats, { prefix: layout.refs() }, signal)) {
      const parsed = layout.parseRef(entry.key);
      if (parsed === undefined) {
        corrupt(entry.key, "not a reference key");
        continue;
      }
      const value = decode.ref(entry);
      if (value === undefined) continue;
      batch.push({ ...parsed, ...value });
      if (batch.length >= REF_BATCH) {
        yield* await this.#judge(batch, signal);
        batch = [];
      }
    }
    yield* await this.#judge(batch, signal);
  }

  /** The liveness of `refs`, judged from their nodes' lease records (read once per batch). */
  async #judge(
    refs: readonly { key: string; node: string; id: number; lease: string }[],
    signal: AbortSignal,
  ): Promise<StoredReference[]> {
    const { settings } = this.#ctx;
    const leases = await readLeases(this.#ctx, this.#stats, refs.map((r) => r.node), signal);
    const now = settings.now();
    return refs.map(({ key, node, id, lease }) => ({
      key,
      node,
      id,
      live: isLive({ id, lease }, leases.get(node), now, settings.maxClockSkewMs),
    }));
  }

  /**
   * Deletes `node`'s reference to `key` only if `node` is not live (its lease record cannot be
   * read, or expired beyond the skew margin). A live node's reference is refused with
   * {@linkcode LiveEntryError}: deleting it would take the ID from under a running node, which
   * writes it back at its next sync anyway.
   */
  async deleteReference(key: string, node: string, signal: AbortSignal): Promise<boolean> {
    const { layout, settings } = this.#ctx;
    const ref = layout.ref(key, node);
    // Guarded by the entry's and the lease record's versionstamps: a node that rewrote its
    // reference or came back meanwhile (a renewed or new lease) makes the commit fail, and the
    // next round judges again.
    for (;;) {
      const entry = await get(this.#ctx, this.#stats, ref, signal);
      if (entry.versionstamp === null) return false;
      const lease = (await readLeases(this.#ctx, this.#stats, [node], signal)).get(node);
      if (nodeIsLive(lease, settings.now(), settings.maxClockSkewMs)) {
        throw new LiveEntryError(`node ${node}'s reference to '${key}'`, [node]);
      }
      const op = this.#ctx.kv.atomic()
        .check(entry, { key: layout.lease(node), versionstamp: lease?.versionstamp ?? null })
        .delete(ref);
      if ((await commit(this.#stats, op, signal)).ok) return true;
    }
  }
}
