/**
 * Errors of the Kubernetes backend's API client. The connection and access classes are idalloc's
 * store-neutral ones (`src/errors.ts`); this module adds what only a Kubernetes API server can say:
 *
 * | class                                 | what happened                                            | retryable |
 * | ------------------------------------- | -------------------------------------------------------- | --------- |
 * | {@linkcode KubeApiError}              | the API server answered with a `Status` (409, 410, 422…) | 429, 5xx  |
 * | {@linkcode ResourceNotInstalledError} | the resource's CRD (or API group) is not installed       | no        |
 * | {@linkcode NotKubernetesApiError}     | something answers at the server URL, but not Kubernetes  | no        |
 * | {@linkcode NotIdentityResourceError}  | the identity resource is served, but is not one          | no        |
 * | {@linkcode CredentialPluginError}     | an `exec` credential plugin gave no credential           | no        |
 *
 * The client maps 401 and 403 to `StoreAccessDeniedError` (a 403 names the verb, the resource and
 * the RBAC rule to add), and transport failures to `StoreConnectionRefusedError`,
 * `StoreHostNotFoundError`, `StoreUnavailableError` (no answer in time) and `StoreTlsError`.
 *
 * @example Telling a taken name from other answers
 * ```ts
 * import assert from "node:assert/strict";
 * import { KubeApiError } from "./errors.ts";
 *
 * const err = KubeApiError.fromStatus({
 *   kind: "Status",
 *   code: 409,
 *   reason: "AlreadyExists",
 *   message: 'ciliumidentities.cilium.io "7" already exists',
 *   details: { name: "7", group: "cilium.io", kind: "ciliumidentities" },
 * }, 409);
 * assert.ok(err.is("AlreadyExists"));
 * assert.equal(err.details?.name, "7");
 * assert.equal(err.retryable, false);
 * ```
 *
 * @module
 */
import { IdallocError, type IdallocErrorOptions } from "../../errors.ts";

/** `details` of a Kubernetes `Status`: which object, and the field causes of a 422. */
export interface KubeStatusDetails {
  /** The object's name. */
  readonly name?: string;
  /** Its API group (`""` or absent for the core group). */
  readonly group?: string;
  /** Its kind or plural, as the server names it. */
  readonly kind?: string;
  /** Its UID. */
  readonly uid?: string;
  /** The causes of an `Invalid` answer, one per field. */
  readonly causes?: readonly { reason?: string; message?: string; field?: string }[];
  /** Seconds after which a retry may succeed (429, 503). */
  readonly retryAfterSeconds?: number;
}

/**
 * The reasons the API server gives in a `Status` (`metav1.StatusReason`). Any other string may
 * come from a newer server; the type keeps it open.
 */
export type KubeStatusReason =
  | "AlreadyExists"
  | "Conflict"
  | "NotFound"
  | "Expired"
  | "Gone"
  | "Invalid"
  | "BadRequest"
  | "Forbidden"
  | "Unauthorized"
  | "MethodNotAllowed"
  | "NotAcceptable"
  | "UnsupportedMediaType"
  | "RequestEntityTooLarge"
  | "TooManyRequests"
  | "Timeout"
  | "ServerTimeout"
  | "ServiceUnavailable"
  | "InternalError"
  | "Unknown"
  | (string & Record<never, never>);

/** A Kubernetes `Status` object as the API server sends it with a failure. */
export interface KubeStatus {
  /** `"Status"`. */
  readonly kind?: string;
  /** The HTTP status code it stands for. */
  readonly code?: number;
  /** The machine-readable reason. */
  readonly reason?: string;
  /** The server's message. */
  readonly message?: string;
  /** Which object, and why. */
  readonly details?: KubeStatusDetails;
}

/**
 * The API server answered a request with a failure `Status`: a taken name (409 `AlreadyExists`),
 * a failed `resourceVersion` precondition (409 `Conflict`), a missing object (404 `NotFound`), a
 * watch from a compacted version (410 `Expired` or `Gone`), an invalid object or a failed JSON
 * patch `test` (422 `Invalid`), an overloaded or broken server (429, 5xx: retryable). 401, 403 and
 * a resource that is not installed never arrive as this class (see the module doc).
 */
export class KubeApiError extends IdallocError {
  /** The HTTP status code (the `Status`'s `code`, else the response's). */
  readonly code: number;
  /** The `Status`'s reason (`"Unknown"` when the server gave none). */
  readonly reason: KubeStatusReason;
  /** The `Status`'s details, when the server gave them. */
  readonly details?: KubeStatusDetails;

  /**
   * Creates the error.
   *
   * @param code the HTTP status code
   * @param reason the `Status` reason
   * @param message the server's message
   * @param details the `Status` details
   * @param options the `cause`
   */
  constructor(
    code: number,
    reason: KubeStatusReason,
    message: string,
    details?: KubeStatusDetails,
    options?: IdallocErrorOptions,
  ) {
    super(message, options, code === 429 || code >= 500);
    this.name = "KubeApiError";
    this.code = code;
    this.reason = reason;
    if (details !== undefined) this.details = details;
  }

  /**
   * The error for a `Status` the server sent (`httpStatus`: the response's status code, used
   * when the `Status` has no `code`).
   */
  static fromStatus(status: KubeStatus, httpStatus: number): KubeApiError {
    const code = typeof status.code === "number" && status.code > 0 ? status.code : httpStatus;
    return new KubeApiError(
      code,
      status.reason || "Unknown",
      status.message || `HTTP ${code}`,
      status.details,
    );
  }

  /** Whether the server gave `reason` (for example `"AlreadyExists"`). */
  is(reason: KubeStatusReason): boolean {
    return this.reason === reason;
  }

  /** Whether this is a watch's `410 Gone` / `Expired`: re-list, then watch from the new version. */
  get expired(): boolean {
    return this.code === 410 || this.reason === "Expired" || this.reason === "Gone";
  }
}

/**
 * The resource is not served by the API server: its CustomResourceDefinition is not installed (or
 * not established yet), or the group/version is wrong. The message names the CRD
 * (`<plural>.<group>`) and how to install it. Not retryable: an operator must install it.
 */
export class ResourceNotInstalledError extends IdallocError {
  /** The resource's full name, `<plural>.<group>` (`<plural>` for the core group). */
  readonly resource: string;

  /**
   * Creates the error.
   * @param message which resource, on which server, and how to install it
   * @param resource `<plural>.<group>`
   * @param options the `cause`
   */
  constructor(message: string, resource: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "ResourceNotInstalledError";
    this.resource = resource;
  }
}

/**
 * Something answers at the server URL, but it is not a Kubernetes API server: an ordinary HTTP
 * server, an etcd client port, a proxy's error page. The kubeconfig's `server` (or
 * `KUBERNETES_SERVICE_HOST`/`_PORT`) is wrong. Not retryable.
 */
export class NotKubernetesApiError extends IdallocError {
  /**
   * Creates the error.
   * @param message which URL, and what answered there
   * @param options the `cause`
   */
  constructor(message: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "NotKubernetesApiError";
  }
}

/**
 * The resource named as the identity resource is served, but its objects are not identities: it
 * is namespaced (Cilium's identities are cluster-scoped), or its objects are of another kind (a
 * `Lease`, a `CiliumEndpoint`), as the API server's discovery tells. The message names the
 * resource, what it is, and Cilium's. Not retryable: the configuration names the wrong resource.
 */
export class NotIdentityResourceError extends IdallocError {
  /** The resource's full name, `<plural>.<group>/<version>`. */
  readonly resource: string;

  /**
   * Creates the error.
   * @param message which resource, what it is, and what to name instead
   * @param resource `<plural>.<group>/<version>`
   * @param options the `cause`
   */
  constructor(message: string, resource: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "NotIdentityResourceError";
    this.resource = resource;
  }
}

/**
 * A kubeconfig user's `exec` credential plugin gave no usable credential: the program is not
 * installed (the message carries its `installHint`), it failed (the message carries the end of its
 * standard error), it needs a terminal (`interactiveMode: Always`), or it printed no valid
 * `ExecCredential`. Not retryable as such: the plugin's setup (a login, a missing tool) is at fault.
 */
export class CredentialPluginError extends IdallocError {
  /** The plugin's command. */
  readonly command: string;

  /**
   * Creates the error.
   * @param message which plugin, and what went wrong
   * @param command the plugin's command
   * @param options the `cause`
   */
  constructor(message: string, command: string, options?: IdallocErrorOptions) {
    super(message, options);
    this.name = "CredentialPluginError";
    this.command = command;
  }
}
