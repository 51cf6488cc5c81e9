/**
 * The Kubernetes API client of the CRD backend: JSON in and out over the API server's REST paths,
 * for any resource named by a {@linkcode KubeResource} (`{group, version, plural, namespaced}`).
 * `get`, `list`, `create`, `update`, `patch` (merge or JSON patch), `delete` (with
 * `resourceVersion`/`uid` preconditions) and `watch` (an `AsyncIterable` of events, bookmarks on,
 * `410` thrown as {@linkcode KubeApiError}), each bounded by the caller's `AbortSignal` and, short
 * of a watch, by a request timeout. {@linkcode KubeClient.probe} checks at connect time, with the
 * caller's own credentials and within a timeout, that the server is Kubernetes, that the resources
 * are installed and that the user may do what it will do.
 *
 * What a call throws:
 * - the API server's failure `Status` (409 `AlreadyExists`/`Conflict`, 404 on `patch`/`update`,
 *   410, 422 `Invalid`, 429, 5xx) → {@linkcode KubeApiError} (`code`, `reason`, `message`, `details`);
 *   a 404 on `get` answers `undefined`, on `delete` `false`;
 * - 401 → `StoreAccessDeniedError` (credentials refused); 403 → `StoreAccessDeniedError` naming the
 *   verb, the resource and the RBAC rule to add;
 * - the resource's CRD not installed → {@linkcode ResourceNotInstalledError};
 * - not Kubernetes at the URL → {@linkcode NotKubernetesApiError};
 * - no answer → `StoreConnectionRefusedError`, `StoreHostNotFoundError`, `StoreTlsError`, or
 *   `StoreUnavailableError` (timeout, connection closed);
 * - the caller's abort → the signal's own `reason`, as web APIs do (a watch just ends).
 *
 * Implemented on each runtime's own HTTP stack (`http.ts`), not `@kubernetes/client-node`: that
 * client opened a new TLS connection for every call (3–5× fewer round trips per second here),
 * costs 0.4–0.8 s to import, takes no per-call `AbortSignal`, and its watch drops the body of a
 * failure answer.
 *
 * @example
 * ```ts ignore
 * // ignored: needs an API server; tests/backends/k8s/client.test.ts runs this for real.
 * await using client = await createKubeClient(await loadKubeconfig("/home/me/.kube/config"));
 * const res = { group: "cilium.io", version: "v2", plural: "ciliumidentities", namespaced: false, kind: "CiliumIdentity" };
 * await client.create(res, { metadata: { name: "1000" }, "security-labels": { "k8s:app": "web" } });
 * const { resourceVersion } = await client.list(res, { limit: 1 });
 * for await (const event of client.watch(res, { resourceVersion, signal })) console.log(event.type);
 * ```
 *
 * @module
 */
import {
  ClosedError,
  errorMessage,
  IdallocError,
  InvalidOptionsError,
  StoreTlsError,
  StoreUnavailableError,
} from "../../errors.ts";
import { certificateProblem } from "../shared/tls.ts";
import type { KubeConnection } from "./kubeconfig.ts";
import { createTransport, type HttpResponse } from "./http.ts";
import {
  answerFailure,
  type FailureContext,
  type KubeResource,
  type KubeVerb,
  notKubernetes,
  resourceName,
  transportFailure,
  transportFailureKind,
} from "./failure.ts";
import { KubeApiError } from "./errors.ts";
import { type AccessReport, probeAccess, type ProbeTarget } from "./client_probe.ts";
import { TokenSource } from "./client_token.ts";
import { WatchStream } from "./client_watch.ts";
import { ConnectionPool, type HealthCheckOptions } from "./client_pool.ts";
import { sleep } from "../../abort.ts";

/** How many times one call waits out a `Retry-After` (client-go's default of 10). */
const MAX_RETRY_AFTER_WAITS = 10;
/** The longest `Retry-After` one wait honours, in ms (longer ones fail the call at once). */
const MAX_RETRY_AFTER_MS = 30_000;

/** The wait a 429 or 503 asks for with its `Retry-After` (seconds), in ms; else `undefined`. */
function retryAfterMs(res: HttpResponse): number | undefined {
  if ((res.status !== 429 && res.status !== 503) || res.retryAfter === undefined) return undefined;
  const seconds = Number(res.retryAfter.trim());
  if (!Number.isInteger(seconds) || seconds < 0 || seconds * 1000 > MAX_RETRY_AFTER_MS) {
    return undefined;
  }
  return seconds * 1000;
}

export type { AccessReport, KubeResource, KubeVerb, ProbeTarget };

/** A resource as the client needs it: where it lives, and its `kind` to fill into created objects. */
export interface KubeResourceDescriptor extends KubeResource {
  /** The kind of its objects (`CiliumIdentity`), set into `create`/`update` bodies that lack one. */
  readonly kind?: string;
}

/** `metadata` of an object: the fields the backend reads; the rest passes through. */
export interface KubeObjectMeta {
  /** The object's name. */
  name?: string;
  /** Its namespace (namespaced resources). */
  namespace?: string;
  /** Its UID. */
  uid?: string;
  /** The version of this state of the object (an opaque string; a precondition for writes). */
  resourceVersion?: string;
  /** When it was created (RFC 3339, 1 s resolution). */
  creationTimestamp?: string;
  /** Set once a delete is pending (finalizers). */
  deletionTimestamp?: string;
  /** Labels. */
  labels?: Record<string, string>;
  /** Annotations. */
  annotations?: Record<string, string>;
  /** Any other field. */
  [field: string]: unknown;
}

/** A Kubernetes object as JSON. */
export interface KubeObject {
  /** `group/version`. */
  apiVersion?: string;
  /** The kind. */
  kind?: string;
  /** Name, versions, labels, annotations. */
  metadata: KubeObjectMeta;
  /** Spec, status, or the resource's own fields (`security-labels`). */
  [field: string]: unknown;
}

/** One page of a list. */
export interface KubeList<T extends KubeObject = KubeObject> {
  /** The objects. */
  readonly items: T[];
  /** The list's `resourceVersion`: watch from it to see every later change. */
  readonly resourceVersion: string;
  /** The token of the next page, when `limit` cut the list. */
  readonly continue?: string;
}

/** A watch event. `BOOKMARK` carries only `object.metadata.resourceVersion`. */
export interface KubeWatchEvent<T extends KubeObject = KubeObject> {
  /** What happened. */
  readonly type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK";
  /** The object (its last state, for `DELETED`). */
  readonly object: T;
}

/** What every call takes. */
export interface CallOptions {
  /** Aborts the call: it rejects with the signal's `reason` (a watch ends). */
  readonly signal?: AbortSignal;
}

/** Options of calls on one object or collection. */
export interface ScopeOptions extends CallOptions {
  /** The namespace of a namespaced resource. @default the client's namespace */
  readonly namespace?: string;
}

/** Options of {@linkcode KubeClient.list}. */
export interface ListOptions extends ScopeOptions {
  /** Every namespace (namespaced resources): ignores `namespace`. */
  readonly allNamespaces?: boolean;
  /** A label selector (`app=web,tier!=db`). */
  readonly labelSelector?: string;
  /** A field selector (`metadata.name=7`). */
  readonly fieldSelector?: string;
  /** At most this many objects; `continue` then names the next page. */
  readonly limit?: number;
  /** The `continue` token of the previous page. */
  readonly continue?: string;
  /** `"0"`: any version the server has cached (cheap); absent: the latest (consistent). */
  readonly resourceVersion?: string;
}

/** Options of {@linkcode KubeClient.watch}. */
export interface WatchOptions extends ScopeOptions {
  /** Every namespace (namespaced resources): ignores `namespace`. */
  readonly allNamespaces?: boolean;
  /** Events after this version (a list's `resourceVersion`, or the last event's). */
  readonly resourceVersion: string;
  /** A label selector. */
  readonly labelSelector?: string;
  /** A field selector. */
  readonly fieldSelector?: string;
  /** Ask for `BOOKMARK` events (the server's progress, when nothing changes). @default {true} */
  readonly bookmarks?: boolean;
  /** The server ends the watch after this long (the iterable then ends: watch again). */
  readonly timeoutSeconds?: number;
  /**
   * Fail with `StoreUnavailableError` when no byte arrives for this long (a stalled server or a
   * silently dropped connection). With bookmarks on, the server sends one at least every minute.
   * @default no limit
   */
  readonly idleTimeoutMs?: number;
}

/** Options of {@linkcode KubeClient.patch}. */
export interface PatchOptions extends ScopeOptions {
  /** `merge`: RFC 7386 merge patch (an object); `json`: RFC 6902 JSON patch (an array of ops). */
  readonly type: "merge" | "json";
}

/** Options of {@linkcode KubeClient.delete}. */
export interface DeleteOptions extends ScopeOptions {
  /** Delete only if the object is still at this version (else 409 `Conflict`). */
  readonly resourceVersion?: string;
  /** Delete only if the object still has this UID (else 409 `Conflict`). */
  readonly uid?: string;
}

/** The API server's build, from `/version`. */
export interface KubeVersion {
  /** Major version, `"1"`. */
  readonly major: string;
  /** Minor version, `"20"`. */
  readonly minor: string;
  /** `v1.20.2`. */
  readonly gitVersion: string;
}

/** What {@linkcode KubeClient.probe} found. */
export interface ProbeReport extends AccessReport {
  /** The API server's build. */
  readonly version: KubeVersion;
}

/** Options of {@linkcode KubeClient.probe}. */
export interface ProbeOptions extends CallOptions {
  /** The whole probe's deadline. @default {10000} */
  readonly timeoutMs?: number;
}

/** The client (see the module doc for what each call throws). */
export interface KubeClient extends AsyncDisposable {
  /** The API server's URL. */
  readonly server: string;
  /** The namespace of namespaced calls that name none. */
  readonly namespace: string;
  /** Where the settings came from (for messages). */
  readonly source: string;
  /** The object, or `undefined` when there is none (404). */
  get<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    name: string,
    options?: ScopeOptions,
  ): Promise<T | undefined>;
  /** One page of objects (every object when no `limit`). */
  list<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    options?: ListOptions,
  ): Promise<KubeList<T>>;
  /** Creates `object`; a taken name throws `KubeApiError` reason `AlreadyExists` (409). */
  create<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    object: KubeObject,
    options?: ScopeOptions,
  ): Promise<T>;
  /**
   * Replaces the object (PUT). `metadata.resourceVersion`, when set, is a precondition: another
   * write since then throws `KubeApiError` reason `Conflict` (409).
   */
  update<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    object: KubeObject,
    options?: ScopeOptions,
  ): Promise<T>;
  /**
   * Patches the object. A missing object throws reason `NotFound` (404); a merge patch carrying
   * `metadata.resourceVersion` that is not the object's throws `Conflict` (409); a JSON patch
   * whose `test` op fails throws `Invalid` (422, empty `details`).
   */
  patch<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    name: string,
    body: unknown,
    options: PatchOptions,
  ): Promise<T>;
  /**
   * Deletes the object: `true`, or `false` when there was none (404). A failed precondition
   * throws reason `Conflict` (409).
   */
  delete(res: KubeResourceDescriptor, name: string, options?: DeleteOptions): Promise<boolean>;
  /**
   * Events after `resourceVersion`, as they happen. Ends when the signal aborts or the server
   * ends the watch (its timeout); throws `KubeApiError` with `expired` (410 `Expired`/`Gone`)
   * when the version is too old: list again and watch from the list's version.
   */
  watch<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    options: WatchOptions,
  ): AsyncIterable<KubeWatchEvent<T>>;
  /** The server's `/version`; `NotKubernetesApiError` when no Kubernetes API server answers. */
  version(options?: CallOptions): Promise<KubeVersion>;
  /**
   * Checks within `timeoutMs`, with the client's credentials: `/version` is Kubernetes, each
   * target's resource is served, and the user may use each of its verbs (a `list` with `limit=1`
   * for `list`, a `SelfSubjectAccessReview` for the others). Throws the first problem as the
   * typed error (a 403 names every missing verb of the resource in one RBAC rule); an `optional`
   * target that is not installed is reported in `missing`.
   */
  probe(targets: readonly ProbeTarget[], options?: ProbeOptions): Promise<ProbeReport>;
  /** Closes the connection pool; calls in flight fail. */
  close(): Promise<void>;
}

/** Options of {@linkcode createKubeClient}. */
export interface KubeClientOptions extends HealthCheckOptions {
  /** Deadline of each call but `watch` (connect, answer and body). @default {30000} */
  readonly requestTimeoutMs?: number;
  /** How often a `tokenFile` is re-read (a rotated service-account token). @default {60000} */
  readonly tokenRefreshMs?: number;
}

/** The HTTP request of one call. */
interface Call {
  readonly verb?: KubeVerb;
  readonly res?: KubeResourceDescriptor;
  readonly namespace?: string;
  readonly name?: string;
  readonly method: "GET" | "POST" | "PUT" | "PATCH" | "DELETE";
  readonly path: string;
  readonly query?: Record<string, string | number | boolean | undefined>;
  readonly body?: unknown;
  readonly contentType?: string;
  readonly signal?: AbortSignal;
}

/** The REST path of `res` (in `namespace` for namespaced resources), and of `name` in it. */
export function resourcePath(
  res: KubeResource,
  namespace: string | undefined,
  name?: string,
): string {
  const base = res.group === "" ? `/api/${res.version}` : `/apis/${res.group}/${res.version}`;
  const ns = res.namespaced && namespace !== undefined
    ? `/namespaces/${encodeURIComponent(namespace)}`
    : "";
  return `${base}${ns}/${res.plural}${name === undefined ? "" : `/${encodeURIComponent(name)}`}`;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === "object" && !Array.isArray(value);
}

/** How {@linkcode HttpKubeClient} remembers a served resource: `<plural>.<group>/<version>`. */
function servedKey(res: KubeResource): string {
  return `${resourceName(res)}/${res.version}`;
}

class HttpKubeClient implements KubeClient {
  readonly server: string;
  readonly namespace: string;
  readonly source: string;
  readonly #pool: ConnectionPool;
  readonly #token: TokenSource;
  readonly #timeoutMs: number;
  /** Whether this server was seen answering as Kubernetes (JSON `Status`, `/version`). */
  #kubernetes = false;
  /**
   * The resources (`<plural>.<group>/<version>`) this server was seen serving. A restarting API
   * server answers a CRD's paths with the mux's plain 404 until its handlers are installed again
   * (measured: a nemesis run's allocations failed as "not installed" right after a restart), so a
   * plain 404 for one of these is the server not ready, not a CRD to install.
   */
  readonly #served = new Set<string>();
  #closed = false;

  readonly connection: KubeConnection;

  constructor(connection: KubeConnection, pool: ConnectionPool, options: KubeClientOptions) {
    this.connection = connection;
    this.server = connection.server;
    this.namespace = connection.namespace;
    this.source = connection.source;
    this.#pool = pool;
    this.#token = new TokenSource(connection, options.tokenRefreshMs ?? 60_000);
    this.#timeoutMs = options.requestTimeoutMs ?? 30_000;
  }

  #namespaceOf(res: KubeResource, options?: { namespace?: string; allNamespaces?: boolean }) {
    if (!res.namespaced || options?.allNamespaces) return undefined;
    return options?.namespace ?? this.namespace;
  }

  #context(call: Call): FailureContext {
    return {
      server: this.server,
      source: this.source,
      ...(call.verb !== undefined && { verb: call.verb }),
      ...(call.res !== undefined && { resource: call.res }),
      ...(call.namespace !== undefined && { namespace: call.namespace }),
      ...(call.name !== undefined && { name: call.name }),
    };
  }

  #url(call: Call): string {
    const url = new URL(this.server + call.path);
    for (const [key, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined) url.searchParams.set(key, String(value));
    }
    return url.href;
  }

  /**
   * Sends `call` once, with the token re-read and the request re-sent once when the server
   * refuses a token that has rotated since. `signal` bounds it (the caller's, linked to a
   * deadline by the caller of this).
   */
  async #send(call: Call, signal: AbortSignal): Promise<HttpResponse> {
    if (this.#closed) throw new ClosedError(`the Kubernetes API client of ${this.server}`);
    let refreshed = false;
    let retried = false;
    for (let waits = 0;; waits++) {
      const auth = await this.#token.header();
      const certificate = await this.#token.certificate();
      const headers: Record<string, string> = {
        accept: "application/json",
        "user-agent": "idalloc",
        ...(auth !== undefined && { authorization: auth }),
        ...(call.body !== undefined && { "content-type": call.contentType ?? "application/json" }),
      };
      let res: HttpResponse;
      try {
        res = await this.#pool.send({
          method: call.method,
          url: this.#url(call),
          headers,
          ...(call.body !== undefined && { body: JSON.stringify(call.body) }),
          signal,
        }, {
          ...(certificate !== undefined && { certificate }),
          streaming: call.query?.watch !== undefined,
        });
      } catch (err) {
        if (signal.aborted) throw signal.reason;
        if (err instanceof StoreUnavailableError) {
          // The pool was found dead under this request and rebuilt: a read is safe to send again
          // (a write may have been applied, so its caller decides).
          if (call.method === "GET" && !retried) {
            retried = true;
            continue;
          }
          throw err;
        }
        throw await this.#noAnswer(err, call);
      }
      if (res.status === 401 && !refreshed) {
        refreshed = true;
        let changed: boolean;
        try {
          changed = await this.#token.reload();
        } catch (err) {
          // The plugin's failure is the answer: the 401 must not stay open in the pool, where the
          // health check takes it for a silent request, pings every idle period and, on
          // node:https, rebuilds the pool (failing every request in flight) each time.
          await res.cancel();
          throw err;
        }
        if (changed) {
          await res.cancel();
          continue;
        }
      }
      // The server said when to come back (API priority and fairness' 429, a 503 while it starts):
      // wait that long and send again, as client-go does, while the deadline allows.
      const wait = retryAfterMs(res);
      if (wait !== undefined && waits < MAX_RETRY_AFTER_WAITS) {
        await res.cancel();
        await sleep(wait, signal);
        continue;
      }
      return res;
    }
  }

  /** The typed error for a request that got no answer; looks again over plain HTTP after TLS failed. */
  async #noAnswer(err: unknown, call: Call): Promise<Error> {
    const ctx = this.#context(call);
    const failure = transportFailure(err, ctx, {
      ...(this.connection.ca !== undefined && { ca: this.connection.ca }),
      ...(this.connection.cert !== undefined && { cert: this.connection.cert }),
      ...(this.connection.tlsServerName !== undefined && {
        serverName: this.connection.tlsServerName,
      }),
    });
    const kind = transportFailureKind(err);
    if (
      this.server.startsWith("https:") &&
      (kind === "reset" ||
        kind === "tls" && (failure as { problem?: string }).problem !== "untrusted")
    ) {
      // A TLS handshake that fails, or a connection closed, without a word about certificates:
      // if something answers plain HTTP there, it is no Kubernetes API server (those speak TLS
      // only).
      const plain = await plainAnswer(this.server.replace(/^https:/, "http:"));
      if (
        plain !== undefined && !/Client sent an HTTP request to an HTTPS server/.test(plain.text)
      ) {
        return notKubernetes(ctx, plain.status, plain.contentType, plain.text, { cause: err });
      }
    }
    return failure;
  }

  /** Runs `call` and returns its JSON body (throws the typed failure for a non-2xx answer). */
  async #json(call: Call, accept404 = false): Promise<unknown> {
    return await this.#bounded(call.signal, async (signal, progress) => {
      const res = await this.#send(call, signal);
      progress();
      const text = await this.#readText(res, signal, progress);
      if (res.status === 404 && accept404) {
        const failure = await this.#failure(res, text, call);
        if (failure instanceof KubeApiError && failure.is("NotFound")) return undefined;
        throw failure;
      }
      if (res.status < 200 || res.status >= 300) throw await this.#failure(res, text, call);
      return this.#parse(res, text, call);
    });
  }

  /**
   * The body of `res` as text; `progress` is told of every chunk (a large list on a slow link
   * keeps its deadline moving while it arrives).
   */
  async #readText(
    res: HttpResponse,
    signal: AbortSignal,
    progress?: () => void,
  ): Promise<string> {
    try {
      const decoder = new TextDecoder();
      let text = "";
      for await (const chunk of res.chunks()) {
        progress?.();
        text += decoder.decode(chunk, { stream: true });
      }
      return text + decoder.decode();
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      throw new StoreUnavailableError(
        `${this.server} (${this.source}) closed the connection in the middle of an answer`,
        { cause: err },
      );
    }
  }

  #parse(res: HttpResponse, text: string, call: Call): unknown {
    let body: unknown;
    try {
      body = res.contentType.includes("json") ? JSON.parse(text) : undefined;
    } catch {
      body = undefined;
    }
    if (!isObject(body)) {
      throw notKubernetes(this.#context(call), res.status, res.contentType, text);
    }
    this.#answered(call);
    return body;
  }

  /** Notes that the server answered `call` as Kubernetes, through the resource's own handler. */
  #answered(call: Call): void {
    this.#kubernetes = true;
    if (call.res !== undefined) this.#served.add(servedKey(call.res));
  }

  async #failure(res: HttpResponse, text: string, call: Call): Promise<Error> {
    const ctx = this.#context(call);
    const isJson = res.contentType.includes("json");
    if (isJson) this.#answered(call);
    if (
      !isJson && res.status === 404 && call.res !== undefined &&
      this.#served.has(servedKey(call.res))
    ) {
      return new StoreUnavailableError(
        `${this.server} (${this.source}) does not serve ${servedKey(call.res)} right now, ` +
          "though it did before: it is starting (its resource handlers are not installed yet), " +
          "or the CRD was removed",
        { cause: answerFailure(res.status, res.contentType, text, ctx, true) },
      );
    }
    // A plain-text 404 is a missing resource only if this server is Kubernetes: ask it once.
    if (!isJson && res.status === 404 && !this.#kubernetes) {
      try {
        await this.version(call.signal ? { signal: call.signal } : {});
      } catch (err) {
        return err as Error;
      }
    }
    return answerFailure(res.status, res.contentType, text, ctx, this.#kubernetes);
  }

  /**
   * Runs `body` under a signal that aborts with the caller's `signal` or after the request
   * timeout; a timeout becomes `StoreUnavailableError`. `body` may call `progress` as an answer's
   * parts arrive: the timeout then starts again, so it bounds silence, not the size of a body.
   * Leaves no timer or listener behind.
   */
  async #bounded<T>(
    signal: AbortSignal | undefined,
    body: (signal: AbortSignal, progress: () => void) => Promise<T>,
    timeoutMs = this.#timeoutMs,
  ): Promise<T> {
    if (signal?.aborted) throw signal.reason;
    const controller = new AbortController();
    const timeout = new DOMException(`no answer within ${timeoutMs} ms`, "TimeoutError");
    const arm = () => setTimeout(() => controller.abort(timeout), timeoutMs);
    let timer = arm();
    const progress = () => {
      clearTimeout(timer);
      timer = arm();
    };
    const onAbort = () => controller.abort(signal!.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      return await body(controller.signal, progress);
    } catch (err) {
      if (err === timeout) {
        // No answer in time may be a dead connection: have the pool check itself now.
        this.#pool.suspect();
        throw new StoreUnavailableError(
          `${this.server} (${this.source}) gave no answer within ${timeoutMs} ms`,
          { cause: err },
        );
      }
      throw err;
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }

  #withKind(res: KubeResourceDescriptor, object: KubeObject): KubeObject {
    const apiVersion = res.group === "" ? res.version : `${res.group}/${res.version}`;
    return {
      ...object,
      apiVersion: object.apiVersion ?? apiVersion,
      ...(object.kind === undefined && res.kind !== undefined && { kind: res.kind }),
    };
  }

  /**
   * The call of `verb` on `res` (on object `name`, if given) in the namespace `options` select:
   * the REST path, and the context every failure message names.
   */
  #call(
    verb: KubeVerb,
    res: KubeResourceDescriptor,
    options: (ScopeOptions & { allNamespaces?: boolean }) | undefined,
    request: Pick<Call, "method" | "query" | "body" | "contentType"> & { name?: string },
  ): Call {
    const namespace = this.#namespaceOf(res, options);
    const { name, ...rest } = request;
    // A create names its object in the body, not in the path.
    const pathName = request.method === "POST" ? undefined : name;
    return {
      verb,
      res,
      namespace,
      ...(name !== undefined && { name }),
      path: resourcePath(res, namespace, pathName),
      signal: options?.signal,
      ...rest,
    };
  }

  async get<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    name: string,
    options?: ScopeOptions,
  ): Promise<T | undefined> {
    return await this.#json(this.#call("get", res, options, { method: "GET", name }), true) as
      | T
      | undefined;
  }

  async list<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    options?: ListOptions,
  ): Promise<KubeList<T>> {
    const call = this.#call("list", res, options, {
      method: "GET",
      query: {
        labelSelector: options?.labelSelector,
        fieldSelector: options?.fieldSelector,
        limit: options?.limit,
        continue: options?.continue,
        resourceVersion: options?.resourceVersion,
      },
    });
    const body = await this.#json(call) as {
      items?: unknown;
      metadata?: { resourceVersion?: unknown; continue?: unknown };
    };
    if (!Array.isArray(body.items) || typeof body.metadata?.resourceVersion !== "string") {
      throw notKubernetes(this.#context(call), 200, "application/json", "a list without items");
    }
    const next = body.metadata.continue;
    return {
      items: (body.items as T[]).filter((item) => isObject(item) && isObject(item.metadata)),
      resourceVersion: body.metadata.resourceVersion,
      ...(typeof next === "string" && next !== "" && { continue: next }),
    };
  }

  async create<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    object: KubeObject,
    options?: ScopeOptions,
  ): Promise<T> {
    return await this.#json(this.#call("create", res, options, {
      method: "POST",
      name: object.metadata?.name,
      body: this.#withKind(res, object),
    })) as T;
  }

  async update<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    object: KubeObject,
    options?: ScopeOptions,
  ): Promise<T> {
    const name = object.metadata?.name;
    if (typeof name !== "string" || name === "") {
      throw new InvalidOptionsError("update: the object has no metadata.name");
    }
    return await this.#json(this.#call("update", res, options, {
      method: "PUT",
      name,
      body: this.#withKind(res, object),
    })) as T;
  }

  async patch<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    name: string,
    body: unknown,
    options: PatchOptions,
  ): Promise<T> {
    return await this.#json(this.#call("patch", res, options, {
      method: "PATCH",
      name,
      body,
      contentType: options.type === "json"
        ? "application/json-patch+json"
        : "application/merge-patch+json",
    })) as T;
  }

  async delete(
    res: KubeResourceDescriptor,
    name: string,
    options?: DeleteOptions,
  ): Promise<boolean> {
    const preconditions = {
      ...(options?.resourceVersion !== undefined && { resourceVersion: options.resourceVersion }),
      ...(options?.uid !== undefined && { uid: options.uid }),
    };
    const answer = await this.#json(
      this.#call("delete", res, options, {
        method: "DELETE",
        name,
        body: {
          kind: "DeleteOptions",
          apiVersion: "v1",
          ...(Object.keys(preconditions).length > 0 && { preconditions }),
        },
      }),
      true,
    );
    return answer !== undefined;
  }

  async *watch<T extends KubeObject = KubeObject>(
    res: KubeResourceDescriptor,
    options: WatchOptions,
  ): AsyncGenerator<KubeWatchEvent<T>> {
    const { signal } = options;
    if (signal?.aborted) return;
    const call = this.#call("watch", res, options, {
      method: "GET",
      query: {
        watch: 1,
        resourceVersion: options.resourceVersion,
        allowWatchBookmarks: options.bookmarks === false ? undefined : true,
        labelSelector: options.labelSelector,
        fieldSelector: options.fieldSelector,
        timeoutSeconds: options.timeoutSeconds,
      },
    });
    // The stream's signal bounds everything, the body included: the request timeout until the
    // answer's head arrives, then the idle timeout (if any) between chunks.
    const stream = new WatchStream(signal, this.#timeoutMs, options.idleTimeoutMs);
    try {
      let response: HttpResponse;
      try {
        response = await this.#send(call, stream.signal);
      } catch (err) {
        if (signal?.aborted) return;
        if (stream.idle !== undefined) this.#pool.suspect();
        throw stream.idle ?? err;
      }
      stream.headReceived();
      if (response.status !== 200) {
        const text = await this.#readText(response, stream.signal).catch(() => "");
        throw await this.#failure(response, text, call);
      }
      this.#answered(call);
      yield* this.#events<T>(response, stream, call);
    } finally {
      stream.dispose();
    }
  }

  async *#events<T extends KubeObject>(
    response: HttpResponse,
    stream: WatchStream,
    call: Call,
  ): AsyncGenerator<KubeWatchEvent<T>> {
    try {
      for await (const line of stream.lines(response.chunks())) {
        const event = this.#event<T>(line, call);
        if (event !== undefined) yield event;
      }
    } catch (err) {
      if (stream.idle !== undefined) {
        this.#pool.suspect();
        throw stream.idle;
      }
      if (stream.aborted) return;
      // The server's own failure (an ERROR event: 410, 500…) as it was classified.
      if (err instanceof IdallocError) throw err;
      throw new StoreUnavailableError(
        `${this.server} (${this.source}): the watch of ${call.path} broke off ` +
          `(${errorMessage(err)})`,
        { cause: err },
      );
    }
  }

  #event<T extends KubeObject>(line: string, call: Call): KubeWatchEvent<T> | undefined {
    let event: { type?: unknown; object?: unknown };
    try {
      event = JSON.parse(line);
    } catch (err) {
      throw new StoreUnavailableError(
        `${this.server}: a watch event of ${call.path} is not JSON: ${line.slice(0, 200)}`,
        { cause: err },
      );
    }
    if (event.type === "ERROR") {
      const status = isObject(event.object) ? event.object : {};
      throw answerFailure(
        typeof status.code === "number" ? status.code : 500,
        "application/json",
        JSON.stringify({ kind: "Status", ...status }),
        this.#context(call),
      );
    }
    if (
      (event.type === "ADDED" || event.type === "MODIFIED" || event.type === "DELETED" ||
        event.type === "BOOKMARK") && isObject(event.object) && isObject(event.object.metadata)
    ) {
      return { type: event.type, object: event.object as T };
    }
    return undefined;
  }

  async version(options?: CallOptions): Promise<KubeVersion> {
    const call: Call = { method: "GET", path: "/version", signal: options?.signal };
    const body = await this.#bounded(options?.signal, async (signal) => {
      const res = await this.#send(call, signal);
      const text = await this.#readText(res, signal);
      let json: unknown;
      try {
        json = res.contentType.includes("json") ? JSON.parse(text) : undefined;
      } catch {
        json = undefined;
      }
      // 401/403 from a Kubernetes API server come as a JSON Status.
      if (res.status !== 200) {
        if (isObject(json) && json.kind === "Status") {
          this.#kubernetes = true;
          throw answerFailure(res.status, res.contentType, text, this.#context(call));
        }
        throw answerFailure(res.status, res.contentType, text, this.#context(call), false);
      }
      if (
        !isObject(json) || typeof json.gitVersion !== "string" || typeof json.major !== "string"
      ) {
        throw notKubernetes(this.#context(call), res.status, res.contentType, text);
      }
      return json;
    });
    this.#kubernetes = true;
    return {
      major: String(body.major),
      minor: String(body.minor ?? ""),
      gitVersion: String(body.gitVersion),
    };
  }

  async probe(targets: readonly ProbeTarget[], options?: ProbeOptions): Promise<ProbeReport> {
    const timeoutMs = options?.timeoutMs ?? 10_000;
    return await this.#bounded(options?.signal, async (signal) => {
      const version = await this.version({ signal });
      return { version, ...await probeAccess(this, targets, signal) };
    }, timeoutMs);
  }

  /** POSTs `body` to `path` (for the probe's access reviews); the JSON answer. */
  async post(path: string, body: unknown, signal: AbortSignal): Promise<unknown> {
    return await this.#json({ method: "POST", path, body, signal });
  }

  /** The discovery document of `group`/`version` (for the probe's kind check); the JSON answer. */
  async discovery(group: string, version: string, signal: AbortSignal): Promise<unknown> {
    const path = group === "" ? `/api/${version}` : `/apis/${group}/${version}`;
    return await this.#json({ method: "GET", path, signal });
  }

  close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      this.#pool.close();
    }
    return Promise.resolve();
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** What answers plain HTTP at `url` (one `GET /`, 2 s at most), or `undefined`. */
async function plainAnswer(
  url: string,
): Promise<{ status: number; contentType: string; text: string } | undefined> {
  const transport = await createTransport({ server: url });
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), 2000);
  try {
    const res = await transport.send({
      method: "GET",
      url: `${url}/version`,
      headers: { accept: "application/json" },
      signal: controller.signal,
    });
    return { status: res.status, contentType: res.contentType, text: await res.text() };
  } catch {
    return undefined;
  } finally {
    clearTimeout(timer);
    transport.close();
  }
}

/**
 * A client of the API server `connection` names (see `kubeconfig.ts`). Nothing is sent yet: call
 * {@linkcode KubeClient.probe} to check the server and the rights up front.
 */
export async function createKubeClient(
  connection: KubeConnection,
  options: KubeClientOptions = {},
): Promise<KubeClient> {
  if (connection.tlsServerName !== undefined && connection.server.startsWith("http:")) {
    throw new InvalidOptionsError(`${connection.source}: tls-server-name needs an https:// server`);
  }
  // Checked here, in words: Deno's TLS stack refuses such a file with "BadEncoding", Node's only
  // at the first connection.
  for (const [what, pem] of [["CA", connection.ca], ["client certificate", connection.cert]]) {
    const problem = pem === undefined ? undefined : certificateProblem(pem);
    if (problem !== undefined) {
      throw new StoreTlsError(
        `${connection.server} (${connection.source}): the ${what} is not a PEM certificate: ${problem}`,
        "not-a-certificate",
      );
    }
  }
  let pool: ConnectionPool;
  try {
    pool = await ConnectionPool.open(connection, options);
  } catch (err) {
    if (err instanceof InvalidOptionsError) throw err;
    throw new StoreTlsError(
      `${connection.server} (${connection.source}): the TLS settings are not usable ` +
        `(${errorMessage(err)})`,
      "handshake",
      { cause: err },
    );
  }
  return new HttpKubeClient(connection, pool, options);
}
