/**
 * The Kubernetes API as the protocol uses it: the `KubeClient` interface of the design note
 * (implemented by `./client.ts`), and a wrapper that counts the round trips of one operation.
 *
 * Stand-in: until the client lands, this module declares the interface itself; afterwards it
 * re-exports the client's types and keeps only {@linkcode countedClient}.
 *
 * @module
 */

/** A resource of the API: `group: ""` is the core group. */
export interface KubeResource {
  /** API group, `""` for the core group. */
  readonly group: string;
  /** API version, e.g. `v2`. */
  readonly version: string;
  /** Plural resource name, e.g. `ciliumidentities`. */
  readonly plural: string;
  /** Whether objects live in a namespace. */
  readonly namespaced: boolean;
}

/** An object's metadata, as far as idalloc reads and writes it. */
export interface KubeMeta {
  /** The object's name. */
  name?: string;
  /** Its namespace (namespaced resources). */
  namespace?: string;
  /** The API server's version of the object. */
  resourceVersion?: string;
  /** The object's UID. */
  uid?: string;
  /** When the API server created it (RFC 3339, seconds). */
  creationTimestamp?: string;
  /** Labels. */
  labels?: Record<string, string>;
  /** Annotations. */
  annotations?: Record<string, string>;
}

/** One object, as JSON. */
export interface KubeObject {
  /** `group/version`. */
  apiVersion?: string;
  /** The kind. */
  kind?: string;
  /** Metadata. */
  metadata: KubeMeta;
  /** Everything else (spec, status, `security-labels`, …). */
  [field: string]: unknown;
}

/** One page of a list. */
export interface KubeList {
  /** The objects. */
  readonly items: KubeObject[];
  /** The list's resource version (watch from it). */
  readonly resourceVersion: string;
  /** The token of the next page, if any. */
  readonly continue?: string;
}

/** One event of a watch. */
export interface KubeWatchEvent {
  /** What happened. */
  readonly type: "ADDED" | "MODIFIED" | "DELETED" | "BOOKMARK";
  /** The object (for a bookmark, only `metadata.resourceVersion`). */
  readonly object: KubeObject;
}

/** Options every call takes. */
export interface KubeCallOptions {
  /** The namespace of a namespaced resource. */
  readonly namespace?: string;
  /** Aborts the call. */
  readonly signal: AbortSignal;
}

/** The Kubernetes API calls the backend makes (see the design note). */
export interface KubeClient {
  /** The API server's URL. */
  readonly server: string;
  /** The namespace of the client's configuration (the kubeconfig context's, or in-cluster). */
  readonly namespace: string;
  /** The object, or `undefined` on 404. */
  get(res: KubeResource, name: string, options: KubeCallOptions): Promise<KubeObject | undefined>;
  /** One page of a list. */
  list(
    res: KubeResource,
    options: KubeCallOptions & {
      readonly labelSelector?: string;
      readonly limit?: number;
      readonly continue?: string;
      readonly resourceVersion?: string;
    },
  ): Promise<KubeList>;
  /** Creates; 409 → `KubeApiError` reason `AlreadyExists`. */
  create(res: KubeResource, obj: KubeObject, options: KubeCallOptions): Promise<KubeObject>;
  /** Replaces, guarded by `metadata.resourceVersion`; 409 → reason `Conflict`. */
  update(res: KubeResource, obj: KubeObject, options: KubeCallOptions): Promise<KubeObject>;
  /** Patches; 404 → reason `NotFound`; a failed JSON-patch `test` → 422 `Invalid`. */
  patch(
    res: KubeResource,
    name: string,
    body: unknown,
    options: KubeCallOptions & { readonly type: "merge" | "json" },
  ): Promise<KubeObject>;
  /** Deletes; false on 404; a failed precondition → 409 reason `Conflict`. */
  delete(
    res: KubeResource,
    name: string,
    options: KubeCallOptions & { readonly resourceVersion?: string },
  ): Promise<boolean>;
  /** Watches from `resourceVersion`; 410 → `KubeApiError` code 410. */
  watch(
    res: KubeResource,
    options: KubeCallOptions & {
      readonly resourceVersion: string;
      readonly labelSelector?: string;
      readonly bookmarks: true;
    },
  ): AsyncIterable<KubeWatchEvent>;
}

/** A failure status of the API server (internal: the backend maps it to idalloc's classes). */
export class KubeApiError extends Error {
  /** HTTP status code. */
  readonly code: number;
  /** The status reason (`AlreadyExists`, `Conflict`, `NotFound`, `Invalid`, `Expired`, …). */
  readonly reason: string;
  /** The status details. */
  readonly details?: unknown;

  /**
   * @param code HTTP status code
   * @param reason the status reason
   * @param message the status message
   * @param details the status details
   */
  constructor(code: number, reason: string, message: string, details?: unknown) {
    super(message);
    this.name = "KubeApiError";
    this.code = code;
    this.reason = reason;
    this.details = details;
  }

  /** Whether this is a watch's `410 Gone` / `Expired`. */
  get expired(): boolean {
    return this.code === 410 || this.reason === "Expired" || this.reason === "Gone";
  }
}

/**
 * Whether `err` is an API status ({@linkcode KubeApiError}, by name) with `code` (and `reason`,
 * when given).
 */
export function isStatus(err: unknown, code: number, reason?: string): err is KubeApiError {
  const e = err as Partial<KubeApiError> | null;
  return typeof e === "object" && e !== null && e.name === "KubeApiError" && e.code === code &&
    (reason === undefined || e.reason === reason);
}

/** A round-trip counter (`AcquireRequest.roundTrips`). */
export interface Tally {
  count: number;
}

/** `client`, with every call (successful or not) counted in `tally`. */
export function countedClient(client: KubeClient, tally: Tally | undefined): KubeClient {
  if (tally === undefined) return client;
  const count = <T>(p: Promise<T>): Promise<T> => {
    tally.count++;
    return p;
  };
  return {
    server: client.server,
    namespace: client.namespace,
    get: (res, name, o) => count(client.get(res, name, o)),
    list: (res, o) => count(client.list(res, o)),
    create: (res, obj, o) => count(client.create(res, obj, o)),
    update: (res, obj, o) => count(client.update(res, obj, o)),
    patch: (res, name, body, o) => count(client.patch(res, name, body, o)),
    delete: (res, name, o) => count(client.delete(res, name, o)),
    watch: (res, o) => {
      tally.count++;
      return client.watch(res, o);
    },
  };
}
