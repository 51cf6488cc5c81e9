/**
 * The client's connection pool, and how it heals (client-go's fix of kubernetes#87615): a
 * connection whose peer stops answering without closing it (a load balancer or control plane
 * swapped, a NAT entry dropped) would keep every call on it waiting until the kernel gives up on
 * the socket, many minutes later. So while requests are open, a read-idle check runs: when no byte
 * has arrived for `healthCheckIdleMs`, a ping (`GET /version`) goes over the pool; no answer within
 * `pingTimeoutMs` and the pool is rebuilt — a new `Deno.createHttpClient` or `node:https` agent —
 * and the requests open on the old one fail at once with `StoreUnavailableError` (their callers
 * retry on the new one). A request that times out rebuilds it too.
 *
 * The pool is also rebuilt when an `exec` credential plugin hands out a new client certificate.
 *
 * @example
 * ```ts ignore
 * // ignored: needs an API server; tests/backends/k8s/client_heal.test.ts runs it through a
 * // stalling proxy.
 * const pool = await ConnectionPool.open(settings, { healthCheckIdleMs: 30_000, pingTimeoutMs: 15_000 });
 * const res = await pool.send({ method: "GET", url, headers: {}, signal });
 * pool.close();
 * ```
 *
 * @module
 */
import { StoreUnavailableError } from "../../errors.ts";
import { idallocLogger } from "../../log.ts";
import {
  createTransport,
  type HttpRequest,
  type HttpResponse,
  type HttpTransport,
  type TransportSettings,
} from "./http.ts";
import type { ClientCertificate } from "./client_token.ts";

const log = idallocLogger("k8s", "client");

/** When the pool checks itself. */
export interface HealthCheckOptions {
  /** Silence on every open request for this long triggers a ping. @default {30000} */
  readonly healthCheckIdleMs?: number;
  /** A ping unanswered for this long rebuilds the pool. @default {15000} */
  readonly pingTimeoutMs?: number;
}

/** A request open on the pool: how to fail it, and when it last read a byte. */
interface OpenRequest {
  readonly controller: AbortController;
  /** A watch: silence is its normal state, only a dead pool fails it here. */
  readonly streaming: boolean;
  lastRead: number;
}

/** One pool's life: its transport and the requests open on it. */
interface Generation {
  readonly transport: HttpTransport;
  readonly cert: string | undefined;
  readonly open: Set<OpenRequest>;
  /** Replaced: close the transport once its last request ends. */
  retired: boolean;
}

/** How {@linkcode ConnectionPool.send} sends. */
export interface SendOptions {
  /** The client certificate an exec plugin gave. */
  readonly certificate?: ClientCertificate;
  /** A watch (see {@linkcode OpenRequest.streaming}). */
  readonly streaming?: boolean;
}

/** The pool (see the module doc). */
export class ConnectionPool {
  readonly #settings: TransportSettings;
  readonly #idleMs: number;
  readonly #pingMs: number;
  #current: Generation;
  #rebuilding: Promise<Generation> | undefined;
  #timer: ReturnType<typeof setInterval> | undefined;
  #ping: AbortController | undefined;
  /** When a ping was last answered. */
  #pingedAt = 0;
  #closed = false;
  /** The client certificate connections present (the kubeconfig's, or an exec plugin's). */
  #cert: ClientCertificate | undefined;
  /** How often the pool was rebuilt (tests and telemetry). */
  rebuilds = 0;

  private constructor(
    settings: TransportSettings,
    transport: HttpTransport,
    options: HealthCheckOptions,
  ) {
    this.#settings = settings;
    this.#idleMs = options.healthCheckIdleMs ?? 30_000;
    this.#pingMs = options.pingTimeoutMs ?? 15_000;
    this.#current = { transport, cert: settings.cert, open: new Set(), retired: false };
    if (settings.cert !== undefined && settings.key !== undefined) {
      this.#cert = { cert: settings.cert, key: settings.key };
    }
  }

  /** A pool for `settings` (throws what `createTransport` throws). */
  static async open(
    settings: TransportSettings,
    options: HealthCheckOptions = {},
  ): Promise<ConnectionPool> {
    return new ConnectionPool(settings, await createTransport(settings), options);
  }

  /** Which stack the pool uses. */
  get kind(): HttpTransport["kind"] {
    return this.#current.transport.kind;
  }

  /**
   * Sends `request` over the pool (rebuilt first when an exec plugin's certificate is not the one
   * it connects with). The response's body counts as open until read or cancelled.
   */
  async send(request: HttpRequest, options: SendOptions = {}): Promise<HttpResponse> {
    let gen = this.#current;
    const { certificate } = options;
    if (certificate !== undefined && certificate.cert !== gen.cert) {
      gen = await this.#rebuild("the exec plugin gave a new client certificate", certificate);
    }
    if (request.signal.aborted) throw request.signal.reason;
    const open: OpenRequest = {
      controller: new AbortController(),
      streaming: options.streaming === true,
      lastRead: Date.now(),
    };
    const { controller } = open;
    const onAbort = () => controller.abort(request.signal.reason);
    request.signal.addEventListener("abort", onAbort, { once: true });
    const release = () => {
      request.signal.removeEventListener("abort", onAbort);
      if (!gen.open.delete(open)) return;
      if (gen.retired && gen.open.size === 0) gen.transport.close();
      if (this.#current.open.size === 0) this.#stopChecks();
    };
    gen.open.add(open);
    this.#startChecks();
    let res: HttpResponse;
    try {
      res = await gen.transport.send({ ...request, signal: controller.signal });
    } catch (err) {
      release();
      // Failed because the pool was found dead: say so, not "aborted".
      if (controller.signal.aborted && !request.signal.aborted) throw controller.signal.reason;
      throw err;
    }
    open.lastRead = Date.now();
    return tracked(res, open, release);
  }

  #startChecks(): void {
    if (this.#timer !== undefined || this.#closed) return;
    const every = Math.max(50, Math.floor(this.#idleMs / 4));
    this.#timer = setInterval(() => void this.#check(), every);
  }

  #stopChecks(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /**
   * The read-idle check: a ping when an open request has been silent for the idle period (or at
   * once when `now`). No answer: the pool is dead, rebuild it. An answer over HTTP/2 proves the
   * one connection every request shares; over HTTP/1.1 (`node:https`) it came on another socket,
   * so a silent request that is no watch sits on a dead one: it fails, with the silent watches,
   * and a new pool takes over.
   */
  async #check(now = false): Promise<void> {
    if (this.#ping !== undefined || this.#closed) return;
    const gen = this.#current;
    const since = Date.now() - this.#idleMs;
    const silent = [...gen.open].filter((o) => o.lastRead <= since);
    // An answered ping counts as a read for the idle clock, as an HTTP/2 PING's ack does.
    if (!now && (silent.length === 0 || this.#pingedAt > since)) return;
    const controller = new AbortController();
    this.#ping = controller;
    const timer = setTimeout(() => controller.abort(), this.#pingMs);
    try {
      const res = await gen.transport.send({
        method: "GET",
        url: `${this.#settings.server}/version`,
        headers: { accept: "application/json", "user-agent": "idalloc" },
        signal: controller.signal,
      });
      await res.cancel();
      this.#pingedAt = Date.now();
    } catch (err) {
      if (gen !== this.#current || this.#closed) return;
      log.warning("no answer from {server} to a health-check ping in {ms} ms: reconnecting", {
        server: this.#settings.server,
        ms: this.#pingMs,
        err: String(err),
      });
      await this.#rebuild(`no answer to a health-check ping within ${this.#pingMs} ms`)
        .catch(() => {});
      return;
    } finally {
      clearTimeout(timer);
      this.#ping = undefined;
    }
    if (gen.transport.kind !== "node" || gen !== this.#current) return;
    // A silent request that is no watch is proof: its socket is dead while new ones work (an old
    // path through a swapped load balancer). The silent watches opened over the same path are
    // then taken as dead too (a watch again from its last version is cheap); a lone silent watch
    // is left to its idle timeout, as silence is its normal state.
    const dead = silent.filter((o) => gen.open.has(o));
    if (!dead.some((o) => !o.streaming)) return;
    await this.#rebuild(
      `no byte for ${this.#idleMs} ms on a connection while the server answers on another`,
      undefined,
      dead,
    ).catch(() => {});
  }

  /**
   * A request on the pool got no answer in time: ping now, whatever the idle clock says (a dead
   * connection would stall the next request the same way; a slow answer on a live one does not
   * rebuild anything).
   */
  suspect(): void {
    void this.#check(true);
  }

  /**
   * A new transport in place of the current one. The old one's requests in `failing` (all of
   * them by default) fail with `why`; it closes once none is left.
   */
  #rebuild(
    why: string,
    certificate?: ClientCertificate,
    failing?: readonly OpenRequest[],
  ): Promise<Generation> {
    this.#rebuilding ??= (async () => {
      const old = this.#current;
      const cert = certificate ?? this.#cert;
      const transport = await createTransport({ ...this.#settings, ...cert });
      if (this.#closed) {
        transport.close();
        return old;
      }
      this.#cert = cert;
      const gen: Generation = { transport, cert: cert?.cert, open: new Set(), retired: false };
      this.#current = gen;
      this.rebuilds++;
      const reason = new StoreUnavailableError(
        `${this.#settings.server}: the connection was dropped and opened again (${why})`,
      );
      old.retired = true;
      for (const o of failing ?? [...old.open]) o.controller.abort(reason);
      // Each aborted request releases itself; a transport without requests left closes now.
      if (failing === undefined) old.open.clear();
      if (old.open.size === 0) old.transport.close();
      if (gen.open.size === 0) this.#stopChecks();
      return gen;
    })().finally(() => (this.#rebuilding = undefined));
    return this.#rebuilding;
  }

  /** Closes the pool; requests in flight fail. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopChecks();
    this.#ping?.abort();
    this.#current.transport.close();
  }
}

/** `res` with every read noted (the health check's clock) and its end releasing the request. */
function tracked(res: HttpResponse, open: OpenRequest, release: () => void): HttpResponse {
  const dead = () => open.controller.signal.aborted ? open.controller.signal.reason : undefined;
  return {
    status: res.status,
    contentType: res.contentType,
    ...(res.retryAfter !== undefined && { retryAfter: res.retryAfter }),
    async text() {
      try {
        const text = await res.text();
        open.lastRead = Date.now();
        return text;
      } catch (err) {
        throw dead() ?? err;
      } finally {
        release();
      }
    },
    async *chunks() {
      try {
        for await (const chunk of res.chunks()) {
          open.lastRead = Date.now();
          yield chunk;
        }
      } catch (err) {
        throw dead() ?? err;
      } finally {
        release();
      }
    },
    async cancel() {
      release();
      await res.cancel();
    },
  };
}
