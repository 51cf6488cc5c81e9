/**
 * The damage report: entries under a store's namespace that idalloc cannot use (written by hand,
 * by a broken tool, by an attacker), listed by a backend and removed one by one on request.
 *
 * Damage never stops idalloc: GC and watches skip what they cannot read and count it
 * ({@linkcode GcSkip}). The report is for an operator (`idalloc doctor`): a backend that
 * implements {@linkcode StoreDoctor} lists {@linkcode DamageFinding}s, and
 * {@linkcode StoreDoctor.removeDamage} deletes one only if the entry is unchanged since it was
 * listed (the store's own guard), so a finding that someone repaired or rewrote meanwhile is left
 * alone.
 *
 * @example List the damage of a store and remove it
 * ```ts
 * import { DenoKvBackend, isStoreDoctor } from "@idalloc/idalloc";
 *
 * using kv = await Deno.openKv(":memory:");
 * await kv.set(["ids", "id", 7], "garbage");
 * const backend = new DenoKvBackend(kv, { prefix: ["ids"], node: "doctor" });
 * if (isStoreDoctor(backend)) {
 *   for await (const finding of backend.findDamage({ range: { min: 1, max: 1000 } })) {
 *     console.log(finding.kind, finding.entry, finding.reason);
 *     await backend.removeDamage(finding);
 *   }
 * }
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import type { IdRange } from "./backend.ts";

/**
 * What is wrong with an entry:
 * - `master-bad-id`: a master key whose ID part is not a non-negative safe integer (or whose key
 *   has the wrong shape);
 * - `master-undecodable`: a master whose value is not a key (not the expected shape, not valid
 *   UTF-8);
 * - `master-empty`: an etcd master with an empty value;
 * - `master-oversized`: a master whose key is too large for the layout (no reference or index of
 *   it can be stored), or whose entry alone exceeds a response limit;
 * - `reference-bad-key`: a reference key without the `<key>/<node>` shape;
 * - `reference-undecodable`: a reference whose value is not an ID (etcd: a decimal safe integer;
 *   Deno KV: `{ id, lease }`);
 * - `reference-out-of-range`: a reference naming an ID outside the scanned range;
 * - `reference-without-lease`: an etcd reference bound to no lease (it would never expire);
 * - `index-undecodable`: a Deno KV key index whose value is not `{ id }` with a safe integer;
 * - `index-orphan`: a Deno KV key index naming an ID whose master is absent or belongs to another
 *   key, or (with a range) an ID outside it;
 * - `counter-wrong-type`: a Deno KV counter (`gen`, `touch`) that does not hold a `Deno.KvU64`;
 * - `lease-undecodable`: a Deno KV lease record of the wrong shape;
 * - `log-undecodable`: a Deno KV change-feed entry of the wrong shape.
 */
export type DamageKind =
  | "master-bad-id"
  | "master-undecodable"
  | "master-empty"
  | "master-oversized"
  | "reference-bad-key"
  | "reference-undecodable"
  | "reference-out-of-range"
  | "reference-without-lease"
  | "index-undecodable"
  | "index-orphan"
  | "counter-wrong-type"
  | "lease-undecodable"
  | "log-undecodable";

/** An entry that GC skipped as damaged (it is neither judged nor collected). */
export interface GcSkip {
  /** What is wrong with it. */
  readonly kind: DamageKind;
  /** The entry in a readable form (the etcd key, or the Deno KV key tuple), shortened if huge. */
  readonly entry: string;
  /** Why it was skipped, in one sentence. */
  readonly reason: string;
}

/** One damaged entry found by {@linkcode StoreDoctor.findDamage}. */
export interface DamageFinding extends GcSkip {
  /** The ID the entry names or belongs to, when it has a usable one. */
  readonly id?: number;
  /** The encoded key the entry belongs to, when known (shortened if huge). */
  readonly key?: string;
  /**
   * Names the exact entry and the version it was listed at, for
   * {@linkcode StoreDoctor.removeDamage}. Opaque, but plain text: it survives JSON and a command
   * line, so a listing can be acted on by another process.
   */
  readonly token: string;
}

/** Options of {@linkcode StoreDoctor.findDamage}. */
export interface DamageScanOptions {
  /**
   * The stored IDs in use (prefix mask applied). With it, references and key indexes naming an ID
   * outside it are reported too; without it, only what is damaged for any range.
   */
  readonly range?: IdRange;
  /** Aborts the scan. */
  readonly signal?: AbortSignal;
}

/** A backend that can list the damage under its namespace and remove it. */
export interface StoreDoctor {
  /**
   * Lists every damaged entry under the namespace. Reads only; safe while nodes run. Entries that
   * are merely stale (dead references, expired leases) are GC's business and not reported.
   */
  findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding>;
  /**
   * Deletes the entry of `finding` if it is unchanged since it was listed. Returns whether it
   * deleted. Throws {@linkcode InvalidOptionsError} for a token that this store did not issue (of
   * another backend, outside the namespace, or mangled).
   */
  removeDamage(
    finding: Pick<DamageFinding, "token">,
    options?: { readonly signal?: AbortSignal },
  ): Promise<boolean>;
}

/** Whether `backend` implements {@linkcode StoreDoctor}. */
export function isStoreDoctor(backend: unknown): backend is StoreDoctor {
  const b = backend as Partial<StoreDoctor> | null;
  return typeof b === "object" && b !== null && typeof b.findDamage === "function" &&
    typeof b.removeDamage === "function";
}

/** Longest text of an entry or key shown in a finding; longer ones are shortened. */
export const SHOWN_CHARS = 200;

/** `text`, shortened to {@linkcode SHOWN_CHARS} with its full length noted. */
export function shorten(text: string): string {
  if (text.length <= SHOWN_CHARS) return text;
  return `${text.slice(0, SHOWN_CHARS)}… (${text.length} chars)`;
}

/** A finding's token: `<backend>:` and its payload as base64url JSON (plain text, no spaces). */
export function encodeToken(backend: string, payload: unknown): string {
  return `${backend}:${Buffer.from(JSON.stringify(payload), "utf8").toString("base64url")}`;
}

/** The payload of a token made by {@linkcode encodeToken} for `backend`, or `undefined`. */
export function decodeToken(token: unknown, backend: string): unknown {
  if (typeof token !== "string" || !token.startsWith(`${backend}:`)) return undefined;
  try {
    return JSON.parse(Buffer.from(token.slice(backend.length + 1), "base64url").toString("utf8"));
  } catch {
    return undefined;
  }
}
