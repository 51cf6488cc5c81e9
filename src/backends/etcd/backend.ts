/**
 * {@linkcode EtcdBackend}: configuration plus the connection to etcd; sessions do the work.
 *
 * @example
 * ```ts
 * import { EtcdBackend } from "./backend.ts";
 *
 * // Needs a running etcd: a function here, so that the doc tests type-check it without calling it.
 * async function requestsSoFar(): Promise<ReturnType<EtcdBackend["requestStats"]>> {
 *   await using backend = await EtcdBackend.connect({
 *     endpoints: ["http://127.0.0.1:2379"],
 *     node: "n1",
 *   });
 *   backend.checkKey("k8s:app=web;");
 *   return backend.requestStats();
 * }
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
import { type IdallocError, InvalidKeyError, StoreUnavailableError } from "../../errors.ts";
import { EtcdAdmin } from "./admin.ts";
import { EtcdClient, ResponseTooLarge } from "./client.ts";
import { findDamage, removeDamage } from "./doctor.ts";
import { certificateProblem } from "../shared/tls.ts";
import {
  connectionFailureOf,
  endpointWords,
  resetFailure,
  summarize,
  typedFailure,
} from "./failure.ts";
import { type PlainProbeVerdict, probePlainEndpoint } from "./probe.ts";
import { NotEtcdServerError, StoreAccessDeniedError, StoreTlsError } from "./errors.ts";
import { prefixRange } from "./txn.ts";
import { type EtcdBackendOptions, type EtcdSettings, resolveEtcdOptions } from "./options.ts";
import { EtcdLayout, keyProblem } from "./layout.ts";
import { type LimiterStats, RequestLimiter } from "./request_limiter.ts";
import { EtcdSession } from "./session.ts";

function never(): AbortSignal {
  return new AbortController().signal;
}

/**
 * How long `connect` retries members that fail for certain (refused, unresolvable, TLS, not etcd)
 * before it gives up, in ms.
 */
const DEFINITE_FAILURE_GRACE_MS = 1_000;

/** How long each step of the second look at an endpoint that closed the connection may take. */
const PROBE_MS = 500;

/**
 * A connection closed without an answer: looks again at the endpoints without TLS (an HTTP/1
 * server? a TLS-only etcd? a plain-text etcd reached with TLS?) and words what is known (see
 * `resetFailure`).
 */
async function explainReset(
  cause: unknown,
  settings: EtcdSettings,
): Promise<IdallocError | undefined> {
  if (connectionFailureOf(cause) !== "reset") return undefined;
  const verdicts = await Promise.all(
    settings.endpoints.map((e) => probePlainEndpoint(e, PROBE_MS)),
  );
  const verdict: PlainProbeVerdict = verdicts.find((v) => v !== undefined);
  return resetFailure(cause, settings.endpoints, settings.tls, verdict);
}

/** Rejects a CA or client certificate that is not a PEM certificate before dialling. */
function checkCertificates(settings: EtcdSettings): void {
  for (const [what, pem] of [["CA", settings.tls?.ca], ["client", settings.tls?.cert]]) {
    if (pem === undefined) continue;
    const problem = certificateProblem(pem);
    if (problem !== undefined) {
      throw new StoreTlsError(
        `the ${what} certificate given for ${endpointWords(settings.endpoints)} is not a PEM ` +
          `certificate: ${problem}`,
        "not-a-certificate",
      );
    }
  }
}

/**
 * Reads one key name under the prefix with the connection's own credentials. etcd answers its
 * status without them, and lets anyone grant a lease: only a read under the prefix tells whether
 * this user may work there. Without it a denied user connected and opened, and allocation waited
 * on a watch that etcd kept refusing, until the caller's deadline. A refusal is a
 * {@linkcode StoreAccessDeniedError} that says which prefix and whose credentials.
 */
async function probePrefix(
  client: EtcdClient,
  settings: EtcdSettings,
  signal: AbortSignal | undefined,
): Promise<void> {
  const base = new EtcdLayout(settings.prefix).base.replace(/\/*$/, "/");
  try {
    await client.call(
      "probe prefix",
      signal,
      (o) => client.raw.kv.range({ ...prefixRange(base), limit: 1, keys_only: true }, o),
    );
  } catch (err) {
    if (!(err instanceof StoreAccessDeniedError)) throw err;
    const where = endpointWords(settings.endpoints);
    const why = summarize(err.cause);
    throw new StoreAccessDeniedError(
      settings.user === undefined
        ? `${where} refused access to prefix ${base}: authentication is on and no user was ` +
          `given (${why})`
        : `${where} refused user ${settings.user} access to prefix ${base} (${why})`,
      { cause: err.cause },
    );
  }
}

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
   * answers within `dialTimeoutMs`. A failure that has a class of its own rejects with it, its
   * message naming the endpoints: {@linkcode StoreHostNotFoundError},
   * {@linkcode StoreConnectionRefusedError} (both retryable {@linkcode StoreUnavailableError}s),
   * {@linkcode StoreTlsError}, {@linkcode NotEtcdServerError}, {@linkcode AuthNotEnabledError},
   * {@linkcode StoreAccessDeniedError}; these come after about a second (other members get that
   * long to answer). No answer at all rejects with {@linkcode StoreUnavailableError} after
   * `dialTimeoutMs`. An aborted `signal` rejects with its reason. Once etcd answers, one read
   * under the prefix with the given credentials (none, a user without permission there) must
   * succeed, else {@linkcode StoreAccessDeniedError} at once.
   */
  static async connect(
    options: EtcdBackendOptions,
    connectOptions: EtcdConnectOptions = {},
  ): Promise<EtcdBackend> {
    const settings = resolveEtcdOptions(options);
    checkCertificates(settings);
    const client = new EtcdClient(settings, new RequestLimiter(settings.qps));
    // The most telling failure seen: a member that failed for certain says more than one that
    // merely closed the connection (a server demanding a client certificate does either).
    let definite: unknown;
    try {
      await client.call(
        "connect",
        connectOptions.signal,
        (o) => client.raw.maintenance.status(o),
        settings.dialTimeoutMs,
        // A refused connection, a name that does not resolve, a TLS or protocol mismatch is an
        // answer: waiting the whole dial timeout only helps a member that is just starting, or
        // another member of the list, which a short grace covers.
        (err, elapsedMs) => {
          const kind = connectionFailureOf(err);
          if (kind !== undefined && kind !== "timeout" && kind !== "reset") definite = err;
          return elapsedMs >= DEFINITE_FAILURE_GRACE_MS && kind !== undefined &&
            kind !== "timeout";
        },
      );
    } catch (err) {
      await client.close();
      if (connectOptions.signal?.aborted) throw err;
      if (err instanceof ResponseTooLarge) {
        // etcd's status answer is a few hundred bytes: a "message" over the receive limit is a
        // non-gRPC body (an HTTP/2 server's error page) read as a gRPC length prefix.
        throw new NotEtcdServerError(
          `${endpointWords(settings.endpoints)} is not an etcd server: something answers there, ` +
            "but not etcd's gRPC API (its answer is not a gRPC message)",
          { cause: err },
        );
      }
      if (err instanceof StoreUnavailableError) {
        const cause = definite ?? err.cause ?? err;
        const typed = typedFailure(cause, settings.endpoints, settings.tls) ??
          await explainReset(cause, settings);
        if (typed !== undefined) throw typed;
        const where = endpointWords(settings.endpoints);
        const message = connectionFailureOf(cause) === "reset"
          ? `${where} closed the connection without answering` +
            (settings.tls
              ? " (if it demands a client certificate, one it trusts is needed)"
              : " (if it serves TLS, a CA is needed)")
          : `${where} did not answer within ${formatMs(settings.dialTimeoutMs)} ` +
            `(${summarize(cause)})`;
        throw new StoreUnavailableError(message, { cause: err });
      }
      throw err;
    }
    try {
      await probePrefix(client, settings, connectOptions.signal);
    } catch (err) {
      await client.close();
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
