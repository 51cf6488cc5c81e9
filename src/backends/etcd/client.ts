/**
 * The one place that talks to `etcd3`: builds the client, runs every unary request through the
 * rate limiter with a deadline, retries transient failures across members until the deadline, and
 * turns client errors into idalloc's error classes.
 *
 * @example
 * ```ts
 * import { bytes, EtcdClient } from "./client.ts";
 * import { resolveEtcdOptions } from "./options.ts";
 * import { RequestLimiter } from "./request_limiter.ts";
 *
 * // Needs a running etcd: a function here, so that the doc tests type-check it without calling it.
 * async function countA(): Promise<string> {
 *   const settings = resolveEtcdOptions({ endpoints: ["http://127.0.0.1:2379"], node: "n1" });
 *   const signal = AbortSignal.timeout(5_000);
 *   const client = new EtcdClient(settings, new RequestLimiter(settings.qps));
 *   try {
 *     const res = await client.call("get", signal, (o) => client.raw.kv.range({ key: bytes("a") }, o));
 *     return res.count;
 *   } finally {
 *     await client.close();
 *   }
 * }
 * ```
 *
 * @module
 */
import { Buffer } from "node:buffer";
import {
  castGrpcError,
  type ClusterClient,
  Etcd3,
  EtcdAuthenticationFailedError,
  EtcdInvalidAuthTokenError,
  EtcdLeaseInvalidError,
  EtcdPermissionDeniedError,
  GRPCCancelledError,
  GRPCUnauthenticatedError,
  type IOptions,
  isRecoverableError,
  type KVClient,
  type LeaseClient,
  type MaintenanceClient,
  type WatchClient,
} from "../../deps/etcd3.ts";
import { ClosedError, errorMessage, IdallocError, StoreUnavailableError } from "../../errors.ts";
import { abortable, sleep } from "../../abort.ts";
import { StoreAccessDeniedError } from "./errors.ts";
import { endpointWords, summarize, typedFailure } from "./failure.ts";
import type { EtcdSettings } from "./options.ts";
import type { RequestLimiter } from "./request_limiter.ts";
import { StoreTelemetry } from "../../telemetry/store.ts";

/** The lease named in a request does not exist (expired or revoked). Internal. */
export class LeaseNotFound extends Error {
  /** @param cause the client's error */
  constructor(cause: unknown) {
    super("etcd lease not found", { cause });
    this.name = "LeaseNotFound";
  }
}

/**
 * A response exceeded the client's receive limit (gRPC RESOURCE_EXHAUSTED, "Received message
 * larger than max"). Internal: a paged read retries with a smaller page; `size` and `max` are the
 * byte counts grpc-js reported, when it did.
 */
export class ResponseTooLarge extends Error {
  /** The response's size in bytes, if reported. */
  readonly size: number | undefined;
  /** The receive limit in bytes, if reported. */
  readonly max: number | undefined;

  /** @param cause the client's error */
  constructor(cause: unknown) {
    super(`etcd response too large: ${errorMessage(cause)}`, { cause });
    this.name = "ResponseTooLarge";
    const m = /larger than max \((\d+) vs\.? (\d+)\)/i.exec(errorMessage(cause));
    this.size = m ? Number(m[1]) : undefined;
    this.max = m ? Number(m[2]) : undefined;
  }
}

/**
 * The response receive limit: far above any page we ask for (pages aim at a fraction of it, see
 * `paging.ts`), so that a page that turns out larger than its estimate still arrives.
 */
export const MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

/** Whether the client refused a response for exceeding its receive limit. */
function tooLarge(err: unknown): boolean {
  return err instanceof Error && /larger than max/i.test(err.message);
}

/**
 * Whether etcd refused the credentials or the permission. etcd3 maps etcd's messages to classes;
 * the message test also catches them when they arrive wrapped or as a bare gRPC status (a server
 * without the token reports "user name is empty").
 */
export function accessDenied(err: unknown): boolean {
  if (
    err instanceof EtcdAuthenticationFailedError || err instanceof EtcdInvalidAuthTokenError ||
    err instanceof EtcdPermissionDeniedError || err instanceof GRPCUnauthenticatedError
  ) {
    return true;
  }
  return err instanceof Error &&
    /authentication failed|invalid auth token|permission denied|user name is empty|UNAUTHENTICATED|PERMISSION_DENIED/i
      .test(err.message);
}

/** A member skipped for a moment after a connection failure (our per-member circuit breaker). */
class MemberSkipped extends Error {
  constructor() {
    super("etcd member skipped after a recent connection failure");
    this.name = "MemberSkipped";
  }
}

/** How long a member that refused a connection is skipped while others are tried. */
const MEMBER_SKIP_MS = 1000;
/** grpc-js's cap on the pause between reconnection attempts to a member. */
const RECONNECT_MAX_MS = 500;
/**
 * grpc-js leaves a failed member's reconnect-backoff timer running after close (up to the cap plus
 * 20 % jitter); `close()` waits that long after the last connection trouble so none outlives it.
 */
const RECONNECT_SETTLE_MS = Math.ceil(RECONNECT_MAX_MS * 1.2) + 100;

/** First and largest pause between retries of one request. */
const RETRY_MIN_MS = 25;
const RETRY_MAX_MS = 500;
/**
 * The first attempt of a request gets a third of its time (at least this much): a member can
 * take a request and never answer it — a write forwarded to a leader that just died is dropped,
 * and etcd reports it only after its own request timeout, longer than ours — and the rest of the
 * time goes to trying again (on whichever member the pool picks), instead of the whole of it to
 * waiting.
 */
const FIRST_ATTEMPT_MIN_MS = 1_000;

function connectionFailure(err: unknown): boolean {
  // "etcdserver: ..." errors come from a reachable member (no leader, leader changed): another
  // member is no better, so those do not trip the breaker. Nor does CANCELLED: grpc-js reports it
  // for a call cancelled on this side, which says nothing about the member.
  // Nor does a response over our own receive limit (RESOURCE_EXHAUSTED, which etcd3 deems
  // recoverable): the member answered.
  return err instanceof Error && isRecoverableError(err) && !(err instanceof GRPCCancelledError) &&
    !err.message.includes("etcdserver:") && !tooLarge(err);
}

/** The context our policies hand to etcd3 (cockatiel's shape; etcd3 does not read it). */
const POLICY_CONTEXT = { signal: new AbortController().signal, attempt: 0 };

/** A structural stand-in for cockatiel's per-host policy (etcd3 only calls `execute`). */
function memberBreaker(): unknown {
  let skipUntil = 0;
  return {
    async execute<T>(fn: (ctx: unknown) => Promise<T>): Promise<T> {
      if (Date.now() < skipUntil) throw new MemberSkipped();
      try {
        return await fn(POLICY_CONTEXT);
      } catch (err) {
        if (connectionFailure(err)) skipUntil = Date.now() + MEMBER_SKIP_MS;
        throw err;
      }
    },
  };
}

/** A global policy that runs the call once: retries happen in {@linkcode EtcdClient.call}. */
const once: unknown = {
  execute<T>(fn: (ctx: unknown) => Promise<T>): Promise<T> {
    return fn(POLICY_CONTEXT);
  },
};

/**
 * etcd3 1.1.2 fetches password tokens through a fresh gRPC client per attempt that it never
 * closes (a leaked channel with its timers each time a token is fetched). Send the
 * `Authenticate` call through the pool's own per-member clients instead, which `close()` closes.
 * Guarded: if etcd3's internals differ, its own behaviour stays.
 */
function routeAuthThroughPool(client: Etcd3): void {
  type Callback = (err: Error | null, res?: { token: string }) => void;
  type AuthService = { authenticate(req: unknown, options: unknown, cb: Callback): void };
  const pool = (client as unknown as {
    pool?: {
      hosts?: Array<{ host: string; getServiceClient(name: string): AuthService }>;
      authenticator?: { getCredentialsFromHost?: unknown };
    };
  }).pool;
  const hosts = pool?.hosts;
  if (
    !hosts || !pool?.authenticator ||
    typeof pool.authenticator.getCredentialsFromHost !== "function"
  ) {
    return;
  }
  pool.authenticator.getCredentialsFromHost = (
    address: string,
    name: string,
    password: string,
    callOptions: unknown,
  ): Promise<string> => {
    const host = hosts.find((h) => h.host === address) ?? hosts[0];
    return new Promise((resolve, reject) => {
      host.getServiceClient("Auth").authenticate(
        { name, password },
        callOptions ?? {},
        (err, res) => (err ? reject(castGrpcError(err)) : resolve(res!.token)),
      );
    });
  };
}

/** The parts of an etcd3 bidirectional stream (watch, lease keepalive) that idalloc uses. */
export interface DuplexStream {
  write(item: unknown): void;
  end(): void;
  cancel(): void;
  readonly writable: boolean;
  on(event: string, fn: (arg: never) => void): unknown;
}

/**
 * Closes a watch or keepalive stream on purpose: half-closes it, then cancels it. etcd3 treats an
 * error of a still-writable stream as a failure of its member (`markFailed`): it closes every
 * channel to the member and feeds the error to the member's breaker, which then skipped the member
 * for {@linkcode MEMBER_SKIP_MS} — so every close of a session or restart of a watch stalled the
 * next requests (~1.3 s with one member). The CANCELLED error that `cancel()` emits finds the
 * stream no longer writable and is ignored. Safe on an ended or failed stream.
 */
export function closeStream(stream: DuplexStream): void {
  try {
    if (stream.writable) stream.end();
  } catch {
    // already ended
  }
  try {
    stream.cancel();
  } catch {
    // already closed
  }
}

/** Whether `err` is gRPC's DEADLINE_EXCEEDED: the attempt's own deadline passed. */
function deadlineExceeded(err: unknown): boolean {
  return err instanceof Error && /DEADLINE_EXCEEDED|deadline exceeded/i.test(err.message);
}

/** Whether a failure of a request is worth retrying on (another) member. */
export function transient(err: unknown): boolean {
  if (err instanceof MemberSkipped) return true;
  if (!(err instanceof Error) || tooLarge(err) || accessDenied(err)) return false;
  if (isRecoverableError(err)) return true;
  // Messages etcd3 does not map to a recoverable class but that mean "try again".
  return /UNAVAILABLE|no connection|no hosts|no leader|leader changed|request timed out|too many requests|not capable|Channel closed|Connection dropped|ECONNREFUSED|ECONNRESET/i
    .test(err.message);
}

/** UTF-8 bytes of a key or value, as the etcd3 client wants them. */
export function bytes(s: string): Buffer {
  return Buffer.from(s, "utf8");
}

/** Per-call gRPC options etcd3 forwards to grpc-js. */
export interface GrpcCallOptions {
  /** Absolute deadline. */
  readonly deadline: Date;
}

/** The raw RPC clients (etcd3's own, not part of any public signature). */
export interface RawClients {
  readonly kv: KVClient;
  readonly lease: LeaseClient;
  readonly watch: WatchClient;
  readonly maintenance: MaintenanceClient;
  readonly cluster: ClusterClient;
}

/** The backend's connection: rate limited, deadline-bounded, retrying, error-mapping. */
export class EtcdClient {
  readonly #client: Etcd3;
  readonly #limiter: RequestLimiter;
  readonly #requestTimeoutMs: number;
  /** The endpoints in words, for messages: `etcd at http://…`. */
  readonly #where: string;
  readonly #endpoints: readonly string[];
  readonly #tls: EtcdSettings["tls"];
  readonly raw: RawClients;
  /** Metrics and spans of this connection's requests (see `src/telemetry/store.ts`). */
  readonly telemetry: StoreTelemetry;
  /** The largest response this client accepts, in bytes. */
  readonly maxResponseBytes: number;
  readonly #operations = new Map<string, number>();
  #closed = false;
  #closing: Promise<void> | undefined;
  #troubleAt = Number.NEGATIVE_INFINITY;
  #healthy = true;
  #lastError: string | undefined;

  /**
   * @param settings validated backend settings
   * @param limiter the request rate limiter
   * @param tuning internal knobs (tests shrink the receive limit to exercise paging)
   */
  constructor(
    settings: EtcdSettings,
    limiter: RequestLimiter,
    tuning: { readonly maxResponseBytes?: number } = {},
  ) {
    this.maxResponseBytes = tuning.maxResponseBytes ?? MAX_RESPONSE_BYTES;
    this.telemetry = new StoreTelemetry("etcd", settings.prefix, settings.node);
    this.#endpoints = settings.endpoints;
    this.#where = endpointWords(settings.endpoints);
    this.#tls = settings.tls;
    const options: IOptions = {
      hosts: [...settings.endpoints],
      grpcOptions: {
        // Per-channel subchannels: close() then really closes the sockets (no shared pool with
        // idle timers), and a restarted member is redialled at once.
        "grpc.use_local_subchannel_pool": 1,
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.max_reconnect_backoff_ms": RECONNECT_MAX_MS,
        // No gRPC keepalive pings: grpc-js leaves their timer running after close(). Dead members
        // show up as failed requests (bounded by the request deadline) and keepalive replies.
        "grpc.max_receive_message_length": tuning.maxResponseBytes ?? MAX_RESPONSE_BYTES,
      },
      faultHandling: {
        host: () => memberBreaker() as never,
        global: once as never,
      },
    };
    if (settings.tls?.serverName) {
      options.grpcOptions = {
        ...options.grpcOptions,
        "grpc.ssl_target_name_override": settings.tls.serverName,
      };
    }
    if (settings.tls) {
      options.credentials = {
        rootCertificate: Buffer.from(settings.tls.ca),
        certChain: settings.tls.cert ? Buffer.from(settings.tls.cert) : undefined,
        privateKey: settings.tls.key ? Buffer.from(settings.tls.key) : undefined,
      };
    }
    if (settings.user !== undefined) {
      options.auth = { username: settings.user, password: settings.password ?? "" };
    }
    this.#client = new Etcd3(options);
    if (options.auth) routeAuthThroughPool(this.#client);
    this.#limiter = limiter;
    this.#requestTimeoutMs = settings.requestTimeoutMs;
    const c = this.#client as unknown as {
      kv: KVClient;
      leaseClient: LeaseClient;
      watchClient: WatchClient;
      maintenance: MaintenanceClient;
      cluster: ClusterClient;
    };
    this.raw = {
      kv: c.kv,
      lease: c.leaseClient,
      watch: c.watchClient,
      maintenance: c.maintenance,
      cluster: c.cluster,
    };
  }

  /** The limiter every request goes through. */
  get limiter(): RequestLimiter {
    return this.#limiter;
  }

  /** Requests sent so far (retries included), by operation name. */
  operations(): Record<string, number> {
    return Object.fromEntries(this.#operations);
  }

  /** Whether the last request reached etcd. */
  get healthy(): boolean {
    return this.#healthy;
  }

  /** The last failure, if any, as text. */
  get lastError(): string | undefined {
    return this.#lastError;
  }

  /** Whether `close()` was called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** Records a background failure (watch, keepalive) for `status()`. */
  noteError(what: string, err: unknown): void {
    this.#lastError = `${what}: ${errorMessage(err)}`;
    // Any stream failure may have left a reconnect timer behind (see close()).
    this.#troubleAt = Date.now();
    if (transient(err)) this.#healthy = false;
  }

  /** Records that etcd answered. */
  noteHealthy(): void {
    this.#healthy = true;
  }

  /** Throws {@linkcode ClosedError} after `close()`. */
  assertOpen(): void {
    if (this.#closed) throw new ClosedError("etcd backend");
  }

  /**
   * Runs one unary request: a rate-limiter token per attempt, transient failures retried on
   * (other) members with a short backoff until `timeoutMs` (default: the request timeout) runs out,
   * then {@linkcode StoreUnavailableError}. A missing lease surfaces as {@linkcode LeaseNotFound},
   * refused credentials or permissions as {@linkcode StoreAccessDeniedError}, a response over the
   * receive limit as {@linkcode ResponseTooLarge} (none of them retried); other failures that
   * retrying cannot fix as their own class when they have one (credentials given to an etcd
   * without authentication, a server that is not etcd: see `failure.ts`). `stopRetrying` may end
   * the retries before the deadline (a connection refused while connecting); it is given the
   * failure worth reporting (the last one of a member actually tried).
   * An aborted `signal` rejects at once with its reason.
   */
  async call<T>(
    what: string,
    signal: AbortSignal | undefined,
    fn: (options: GrpcCallOptions) => Promise<T>,
    timeoutMs: number = this.#requestTimeoutMs,
    stopRetrying?: (err: unknown, elapsedMs: number) => boolean,
  ): Promise<T> {
    this.assertOpen();
    signal?.throwIfAborted();
    // One operation for the telemetry, whatever retries it takes.
    return await this.telemetry.round(
      what,
      signal,
      () => this.#attempts(what, signal, fn, timeoutMs, stopRetrying),
    );
  }

  async #attempts<T>(
    what: string,
    signal: AbortSignal | undefined,
    fn: (options: GrpcCallOptions) => Promise<T>,
    timeoutMs: number,
    stopRetrying?: (err: unknown, elapsedMs: number) => boolean,
  ): Promise<T> {
    const began = Date.now();
    const deadline = began + timeoutMs;
    let pause = RETRY_MIN_MS;
    // The failure worth reporting: a member we skipped says less than the one that failed.
    let reported: unknown;
    let attemptEnd = Math.min(deadline, began + Math.max(FIRST_ATTEMPT_MIN_MS, timeoutMs / 3));
    for (;;) {
      await this.#limiter.take(signal);
      this.assertOpen();
      this.#operations.set(what, (this.#operations.get(what) ?? 0) + 1);
      const cut = attemptEnd < deadline;
      try {
        const result = await abortable(fn({ deadline: new Date(attemptEnd) }), signal);
        this.#healthy = true;
        return result;
      } catch (err) {
        this.#troubleAt = Date.now();
        if (signal?.aborted) throw signal.reason;
        if (this.#closed) throw new ClosedError("etcd backend", { cause: err });
        if (err instanceof EtcdLeaseInvalidError || /lease not found/i.test(errorMessage(err))) {
          throw new LeaseNotFound(err);
        }
        if (tooLarge(err)) throw new ResponseTooLarge(err);
        if (accessDenied(err)) {
          this.#lastError = `${what}: ${errorMessage(err)}`;
          // The step (`what`) stays in `lastError`; the message names what etcd refused.
          throw new StoreAccessDeniedError(`${this.#where} refused access: ${summarize(err)}`, {
            cause: err,
          });
        }
        if (!(err instanceof MemberSkipped) || reported === undefined) reported = err;
        this.#lastError = `${what}: ${errorMessage(reported)}`;
        // The first attempt ran out of its share of the time: the rest is for the next ones.
        const ranOut = cut && Date.now() >= attemptEnd - 5 && deadlineExceeded(err);
        attemptEnd = deadline;
        if (!ranOut && !transient(err)) {
          throw typedFailure(err, this.#endpoints, this.#tls) ??
            new IdallocError(`etcd ${what} failed: ${errorMessage(err)}`, { cause: err });
        }
        this.#healthy = false;
        if (Date.now() + pause >= deadline || stopRetrying?.(reported, Date.now() - began)) {
          throw new StoreUnavailableError(
            `${this.#where}: ${what} failed: ${summarize(reported)}`,
            { cause: reported },
          );
        }
        this.telemetry.retry(what, err);
        await sleep(pause, signal);
        pause = Math.min(pause * 2, RETRY_MAX_MS);
      }
    }
  }

  /**
   * Closes every connection; later calls throw {@linkcode ClosedError}. After recent connection
   * trouble it resolves only once grpc-js's reconnect timers have run out. Idempotent.
   */
  close(): Promise<void> {
    this.#closing ??= (async () => {
      this.#closed = true;
      this.#client.close();
      const settle = this.#troubleAt + RECONNECT_SETTLE_MS - Date.now();
      if (settle > 0) await sleep(settle);
    })();
    return this.#closing;
  }
}
