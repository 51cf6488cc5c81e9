/**
 * {@linkcode EtcdBackend}: configuration plus the connection to etcd; sessions do the work.
 *
 * @example
 * ```ts
 * import { EtcdBackend } from "./backend.ts";
 *
 * await using backend = await EtcdBackend.connect({ endpoints: ["http://127.0.0.1:2379"], node: "n1" });
 * backend.checkKey("k8s:app=web;");
 * console.log(backend.requestStats());
 * ```
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
import { InvalidKeyError, StoreUnavailableError } from "../../errors.ts";
import { EtcdAdmin } from "./admin.ts";
import { EtcdClient } from "./client.ts";
import { findDamage, removeDamage } from "./doctor.ts";
import { keyProblem } from "./key_check.ts";
import { connectionFailureOf, summarize } from "./failure.ts";
import { type EtcdBackendOptions, type EtcdSettings, resolveEtcdOptions } from "./options.ts";
import { EtcdLayout } from "./paths.ts";
import { type LimiterStats, RateLimiter } from "./rate_limiter.ts";
import { EtcdSession } from "./session.ts";

function never(): AbortSignal {
  return new AbortController().signal;
}

/** How long `connect` retries members that refuse the connection before it gives up, in ms. */
const REFUSED_GRACE_MS = 1_000;

function formatMs(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms} ms`;
}

/** Request counters of an {@linkcode EtcdBackend}. */
export interface EtcdRequestStats extends LimiterStats {
  /** Unary requests sent, retries included, by operation name. */
  readonly operations: Readonly<Record<string, number>>;
}

/** Options of {@linkcode EtcdBackend.connect} besides the backend's own. */
export interface EtcdConnectOptions {
  /** Aborts connecting. */
  readonly signal?: AbortSignal;
}

/**
 * The etcd backend, in Cilium's key layout: `<prefix>/id/<ID>` → key (no lease) and
 * `<prefix>/value/<key>/<node>` → ID (on the node's lease). A store written by Cilium's Go
 * allocator is read as is, and Cilium reads what idalloc writes.
 *
 * Allocation is lock-free: a new key costs one transaction uncontended and two when it loses a
 * race; an existing key costs one. Close it with `close()` or `await using` after its allocators.
 */
export class EtcdBackend implements Backend, StoreDoctor, AsyncDisposable {
  /** Always `etcd`. */
  readonly kind: string = "etcd";
  /** This node's name. */
  readonly node: string;
  readonly #settings: EtcdSettings;
  readonly #client: EtcdClient;
  readonly #layout: EtcdLayout;
  readonly #sessions = new Set<EtcdSession>();

  private constructor(settings: EtcdSettings, client: EtcdClient) {
    this.#settings = settings;
    this.#client = client;
    this.node = settings.node;
    this.#layout = new EtcdLayout(settings.prefix);
  }

  /**
   * Validates `options` (throws {@linkcode InvalidOptionsError}), connects, and checks that etcd
   * answers within `dialTimeoutMs` (throws {@linkcode StoreUnavailableError} otherwise).
   */
  static async connect(
    options: EtcdBackendOptions,
    connectOptions: EtcdConnectOptions = {},
  ): Promise<EtcdBackend> {
    const settings = resolveEtcdOptions(options);
    const client = new EtcdClient(settings, new RateLimiter(settings.qps));
    try {
      await client.call(
        "connect",
        connectOptions.signal,
        (o) => client.raw.maintenance.status(o),
        settings.dialTimeoutMs,
        // A refused connection is an answer: nothing listens there. Waiting the whole dial
        // timeout only helps a member that is just starting, which a short grace covers.
        (err, elapsedMs) => elapsedMs >= REFUSED_GRACE_MS && connectionFailureOf(err) === "refused",
      );
    } catch (err) {
      await client.close();
      if (connectOptions.signal?.aborted) throw err;
      if (err instanceof StoreUnavailableError) {
        const where = `etcd at ${settings.endpoints.join(", ")}`;
        const cause = err.cause ?? err;
        const message = connectionFailureOf(cause) === "refused"
          ? `${where} refused the connection`
          : `${where} did not answer within ${formatMs(settings.dialTimeoutMs)} ` +
            `(${summarize(cause)})`;
        throw new StoreUnavailableError(message, { cause: err });
      }
      throw err;
    }
    return new EtcdBackend(settings, client);
  }

  /** The configured endpoints. */
  get endpoints(): readonly string[] {
    return this.#settings.endpoints;
  }

  /** The base prefix of the layout. */
  get prefix(): string {
    return this.#settings.prefix;
  }

  /**
   * Counters of the request rate limiter (every request of this backend goes through it, streams
   * included), and unary requests by operation (`acquire`, `ensure write`, `gc delete`, …).
   */
  requestStats(): EtcdRequestStats {
    return { ...this.#client.limiter.stats(), operations: this.#client.operations() };
  }

  /**
   * Throws {@linkcode InvalidKeyError} for a key etcd cannot hold in this layout: empty, with NUL
   * or lone surrogates, larger than `MAX_KEY_BYTES` (its transactions would exceed
   * etcd's 1.5 MiB request limit), or one that Go's path cleaning moves out of
   * `<prefix>/value/` (e.g. `../id/5`).
   */
  checkKey(key: string): void {
    if (typeof key !== "string") throw new InvalidKeyError("key must be a string");
    const problem = keyProblem(this.#layout, key);
    if (problem !== undefined) throw new InvalidKeyError(problem);
    if (this.#layout.refKey(key, this.node) !== `${this.#layout.refPrefix(key)}/${this.node}`) {
      throw new InvalidKeyError(`key '${key}' does not form a clean reference path`);
    }
  }

  /** Opens a session (the node's leases, watches) for one allocator. */
  async openSession(options: SessionOptions): Promise<BackendSession> {
    const session = await EtcdSession.open({
      client: this.#client,
      layout: this.#layout,
      node: this.node,
      endpoints: this.#settings.endpoints,
      ciliumLocks: this.#settings.honorCiliumLocks,
      groupCommit: this.#settings.groupCommit,
      onClose: (s) => this.#sessions.delete(s),
    }, options);
    this.#sessions.add(session);
    return session;
  }

  /**
   * Lists the damaged masters and references under the prefix (see
   * {@linkcode StoreDoctor.findDamage}): paged reads only, and needs no session.
   */
  findDamage(options?: DamageScanOptions): AsyncIterable<DamageFinding> {
    this.#client.assertOpen();
    return findDamage(this.#client, this.#layout, options);
  }

  /**
   * Deletes the entry of `finding` if its mod revision is unchanged since it was listed (see
   * {@linkcode StoreDoctor.removeDamage}).
   */
  async removeDamage(
    finding: Pick<DamageFinding, "token">,
    options?: { readonly signal?: AbortSignal },
  ): Promise<boolean> {
    this.#client.assertOpen();
    return await removeDamage(this.#client, this.#layout, finding, options?.signal ?? never());
  }

  /**
   * The operator's view of this prefix: references (live while stored: etcd expires them with
   * their leases), the nodes' leases found through them, and deleting one node's reference.
   */
  admin(): BackendAdmin {
    return new EtcdAdmin(this.#client, this.#layout);
  }

  /** Closes open sessions and the connection. Idempotent. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.#sessions].map((s) => s.close()));
    await this.#client.close();
  }

  /** Same as {@linkcode EtcdBackend.close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
