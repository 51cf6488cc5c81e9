/**
 * {@linkcode DenoKvBackend}: configuration of the Deno KV backend (a `Deno.Kv`, a prefix, a node
 * name and timing knobs). It holds no timers; {@linkcode DenoKvBackend.openSession} starts them.
 *
 * @module
 */
import type {
  Backend,
  BackendAdmin,
  BackendSession,
  SessionOptions,
} from "../../allocator/backend.ts";
import type { DamageFinding, DamageScanOptions, StoreDoctor } from "../../allocator/damage.ts";
import { InvalidKeyError } from "../../errors.ts";
import { formatKvPrefix, KvAdmin } from "./admin.ts";
import { StoreTelemetry } from "../../telemetry/store.ts";
import { findDamage, removeDamage } from "./doctor.ts";
import { type KvStats, newStats } from "./client.ts";
import type { KvContext } from "./context.ts";
import { KvLayout } from "./layout.ts";
import {
  MASTER_VALUE_OVERHEAD,
  MAX_CHECKS,
  MAX_KEY_BYTES,
  MAX_VALUE_BYTES,
  NPM_KV_MAX_CHECKS,
} from "./limits.ts";
import { type DenoKvBackendOptions, denoKvU64, resolveKvOptions, resolveKvU64 } from "./options.ts";
import { DenoKvSession } from "./session.ts";

/**
 * The Deno KV backend: IDs and references stored as tuple keys under `options.prefix` in a
 * `Deno.Kv` the caller opened (and closes, after the allocator).
 *
 * A new key costs one atomic commit when uncontended, an existing key not yet held by this node
 * costs one commit, and a lost race costs one read and one more commit. Works on a local file
 * shared by several processes, `:memory:`, and Deno Deploy.
 *
 * @example One backend per node, the Kv owned by the caller
 * ```ts
 * import assert from "node:assert/strict";
 * import { Allocator } from "@idalloc/idalloc";
 * import { DenoKvBackend } from "@idalloc/idalloc/kv";
 *
 * const dir = await Deno.makeTempDir();
 * {
 *   using kv = await Deno.openKv(`${dir}/ids.kv`); // the caller owns the Kv
 *   const backend = new DenoKvBackend(kv, { prefix: ["idalloc", "demo"], node: "node-a" });
 *   await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
 *   assert.equal(alloc.backend.kind, "deno-kv");
 * }
 * await Deno.remove(dir, { recursive: true });
 * ```
 */
export class DenoKvBackend implements Backend, StoreDoctor {
  /** Always `deno-kv`. */
  readonly kind: string = "deno-kv";
  /** This node's name. */
  readonly node: string;
  /** Round trips of the damage report (`findDamage`, `removeDamage`). */
  readonly #doctorStats: KvStats;
  readonly #ctx: KvContext;

  /**
   * Validates `options`; nothing is read or written until {@linkcode DenoKvBackend.openSession}.
   *
   * @param kv the store; the caller keeps owning it (the backend never closes it)
   * @param options prefix, node name and timing knobs
   * @throws {InvalidOptionsError} when `kv` is not a `Deno.Kv` or an option is invalid
   */
  constructor(kv: Deno.Kv, options: DenoKvBackendOptions) {
    const settings = resolveKvOptions(kv, options);
    const KvU64 = resolveKvU64(settings);
    const denoKv = KvU64 === denoKvU64();
    this.node = settings.node;
    this.#ctx = {
      kv,
      KvU64,
      // Deno's own KV, or a store opened by the @deno/kv package (Node.js), which differs: see
      // `KvContext`.
      wakeByWatch: denoKv,
      maxChecks: denoKv ? MAX_CHECKS : NPM_KV_MAX_CHECKS,
      layout: new KvLayout(settings.prefix),
      settings,
      telemetry: new StoreTelemetry("deno-kv", formatKvPrefix(settings.prefix), settings.node),
    };
    this.#doctorStats = newStats(this.#ctx.telemetry);
  }

  /**
   * Throws {@linkcode InvalidKeyError} if `key` is empty or too large for Deno KV once placed in
   * the layout: the largest key written for it, `[...prefix, "ref", key, node]`, must fit in
   * 2048 bytes, and its master value in 64 KiB.
   */
  checkKey(key: string): void {
    if (typeof key !== "string" || key.length === 0) {
      throw new InvalidKeyError("key must be a non-empty string");
    }
    // Deno KV stores key parts as UTF-8: a lone surrogate would be replaced, and two different
    // keys would share one stored key.
    if (!key.isWellFormed()) throw new InvalidKeyError("key must be well-formed Unicode");
    const keyBytes = this.#ctx.layout.largestKeyBytes(key, this.node);
    if (keyBytes > MAX_KEY_BYTES) {
      throw new InvalidKeyError(
        `key is too large for Deno KV: its reference key would take ${keyBytes} bytes, ` +
          `the limit is ${MAX_KEY_BYTES}`,
      );
    }
    // V8 stores a string with only Latin-1 characters one byte per character, else two.
    // deno-lint-ignore no-control-regex
    const valueBytes = key.length * (/^[\u0000-\u00ff]*$/.test(key) ? 1 : 2) +
      MASTER_VALUE_OVERHEAD;
    if (valueBytes > MAX_VALUE_BYTES) {
      throw new InvalidKeyError(
        `key is too large for Deno KV: its master value would take about ${valueBytes} bytes, ` +
          `the limit is ${MAX_VALUE_BYTES}`,
      );
    }
  }

  /**
   * Opens the session the allocator works through: writes this node's lease record (unless
   * read-only) and renews it every `leaseTtlMs / 3`.
   *
   * @throws {InvalidOptionsError} when `leaseTtlMs` is below 2 × `maxClockSkewMs`
   */
  async openSession(options: SessionOptions): Promise<BackendSession> {
    return await DenoKvSession.open(this.#ctx, options);
  }

  /**
   * Lists the damaged entries under the prefix (see {@linkcode StoreDoctor.findDamage}): reads
   * only, and needs no session.
   */
  findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding> {
    return findDamage(this.#ctx, this.#doctorStats, options);
  }

  /**
   * Deletes the entry of `finding` if it is unchanged since it was listed (see
   * {@linkcode StoreDoctor.removeDamage}).
   */
  async removeDamage(
    finding: Pick<DamageFinding, "token">,
    options?: { readonly signal?: AbortSignal },
  ): Promise<boolean> {
    const signal = options?.signal ?? new AbortController().signal;
    return await removeDamage(this.#ctx, this.#doctorStats, finding, signal);
  }

  /**
   * The operator's view of this prefix: namespaces in the `Deno.Kv`, lease records, references
   * with their liveness (judged like the sessions judge it), and deleting one node's reference.
   */
  admin(): BackendAdmin {
    return new KvAdmin(this.#ctx);
  }
}
