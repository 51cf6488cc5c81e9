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

/** One pool's life: its transport and the requests open on it. */
interface Generation {
  readonly transport: HttpTransport;
  readonly cert: string | undefined;
  readonly open: Set<AbortController>;
}

/** The pool (see the module doc). */
export class ConnectionPool {
  readonly #settings: TransportSettings;
  readonly #idleMs: number;
  readonly #pingMs: number;
  #current: Generation;
  #rebuilding: Promise<Generation> | undefined;
  #lastRead = Date.now();
  #timer: ReturnType<typeof setInterval> | undefined;
  #pinging = false;
  #ping: AbortController | undefined;
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
    this.#current = { transport, cert: settings.cert, open: new Set() };
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
   * Sends `request` over the pool (rebuilt first when `certificate`, an exec plugin's, is not the
   * one it connects with). The response's body counts as open until read or cancelled.
   */
  async send(request: HttpRequest, certificate?: ClientCertificate): Promise<HttpResponse> {
    let gen = this.#current;
    if (certificate !== undefined && certificate.cert !== gen.cert) {
      gen = await this.#rebuild("the exec plugin gave a new client certificate", certificate);
    }
    const controller = new AbortController();
    const onAbort = () => controller.abort(request.signal.reason);
    if (request.signal.aborted) throw request.signal.reason;
    request.signal.addEventListener("abort", onAbort, { once: true });
    const release = () => {
      request.signal.removeEventListener("abort", onAbort);
      if (gen.open.delete(controller) && this.#openCount() === 0) this.#stopChecks();
    };
    gen.open.add(controller);
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
    this.#read();
    return this.#tracked(res, controller, release);
  }

  /** `res` with every read noted (the health check's clock) and its end releasing the request. */
  #tracked(res: HttpResponse, controller: AbortController, release: () => void): HttpResponse {
    const read = () => this.#read();
    const dead = () => controller.signal.aborted ? controller.signal.reason : undefined;
    return {
      status: res.status,
      contentType: res.contentType,
      ...(res.retryAfter !== undefined && { retryAfter: res.retryAfter }),
      async text() {
        try {
          const text = await res.text();
          read();
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
            read();
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

  #read(): void {
    this.#lastRead = Date.now();
  }

  #openCount(): number {
    return this.#current.open.size;
  }

  #startChecks(): void {
    if (this.#timer !== undefined || this.#closed) return;
    this.#lastRead = Date.now();
    const every = Math.max(50, Math.floor(this.#idleMs / 4));
    this.#timer = setInterval(() => this.#check(), every);
  }

  #stopChecks(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  async #check(now = false): Promise<void> {
    if (this.#pinging || this.#closed) return;
    if (!now && Date.now() - this.#lastRead < this.#idleMs) return;
    this.#pinging = true;
    const gen = this.#current;
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
      // Any answer, even a refusal, proves the connection carries bytes.
      this.#read();
    } catch (err) {
      if (gen === this.#current && !this.#closed && !controller.signal.reason?.closing) {
        log.warning("no answer from {server} to a health-check ping in {ms} ms: reconnecting", {
          server: this.#settings.server,
          ms: this.#pingMs,
          err: String(err),
        });
        await this.#rebuild(`no answer to a health-check ping within ${this.#pingMs} ms`)
          .catch(() => {});
      }
    } finally {
      clearTimeout(timer);
      this.#pinging = false;
      this.#ping = undefined;
    }
  }

  /**
   * A request on the pool got no answer in time: ping now, whatever the idle clock says (a dead
   * connection would stall the next request the same way; a slow answer on a live one does not
   * rebuild anything).
   */
  suspect(): void {
    void this.#check(true);
  }

  /** A new transport in place of the current one; the old one's open requests fail with `why`. */
  #rebuild(why: string, certificate?: ClientCertificate): Promise<Generation> {
    this.#rebuilding ??= (async () => {
      const old = this.#current;
      const cert = certificate ?? this.#cert;
      const transport = await createTransport({ ...this.#settings, ...cert });
      if (this.#closed) {
        transport.close();
        return old;
      }
      this.#cert = cert;
      const gen: Generation = { transport, cert: cert?.cert, open: new Set() };
      this.#current = gen;
      this.rebuilds++;
      const reason = new StoreUnavailableError(
        `${this.#settings.server}: the connection was dropped and opened again (${why})`,
      );
      for (const controller of old.open) controller.abort(reason);
      old.open.clear();
      old.transport.close();
      if (this.#openCount() === 0) this.#stopChecks();
      this.#lastRead = Date.now();
      return gen;
    })().finally(() => (this.#rebuilding = undefined));
    return this.#rebuilding;
  }

  /** Closes the pool; requests in flight fail. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#stopChecks();
    this.#ping?.abort({ closing: true });
    this.#current.transport.close();
  }
}
