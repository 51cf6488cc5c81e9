/**
 * Failures at the Kubernetes API boundary, in words an operator acts on. Two sources:
 *
 * - **no answer** (the transport failed): {@linkcode transportFailure} turns Deno's `fetch` and
 *   `node:https` errors into `StoreConnectionRefusedError`, `StoreHostNotFoundError`,
 *   `StoreTlsError` (with its `TlsProblem`) or `StoreUnavailableError`;
 * - **an answer that is a failure**: {@linkcode answerFailure} turns it into
 *   `StoreAccessDeniedError` (401: the credentials; 403: the verb, the resource and the RBAC rule
 *   to add), `ResourceNotInstalledError` (the CRD is missing), `StoreUnavailableError` (a 502, 503
 *   or 504 without a `Status`: a proxy, a load balancer or a server not ready, retried),
 *   `NotKubernetesApiError` (not Kubernetes answered) or, for every other `Status`,
 *   {@linkcode KubeApiError}.
 *
 * @example A 403 names the rule to add
 * ```ts
 * import assert from "node:assert/strict";
 * import { answerFailure } from "./failure.ts";
 *
 * const err = answerFailure(403, "application/json", JSON.stringify({
 *   kind: "Status", code: 403, reason: "Forbidden",
 *   message: 'ciliumidentities.cilium.io is forbidden: User "bob" cannot list resource ' +
 *     '"ciliumidentities" in API group "cilium.io" at the cluster scope',
 * }), {
 *   server: "https://127.0.0.1:6443",
 *   source: "kubeconfig /k (context dev)",
 *   verb: "list",
 *   resource: { group: "cilium.io", version: "v2", plural: "ciliumidentities", namespaced: false },
 * });
 * assert.equal(err.name, "StoreAccessDeniedError");
 * assert.match(err.message, /user "bob" may not list ciliumidentities\.cilium\.io/);
 * assert.match(err.message, /\{apiGroups: \["cilium\.io"\], resources: \["ciliumidentities"\], verbs: \["list"\]\}/);
 * ```
 *
 * @module
 */
import {
  errorMessage,
  type IdallocError,
  StoreAccessDeniedError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
  StoreUnavailableError,
} from "../../errors.ts";
// The TLS stacks' words (rustls', OpenSSL's) are the same for every backend; etcd's reading of
// them is reused rather than repeated.
import { tlsProblemOf } from "../shared/tls.ts";
import {
  KubeApiError,
  type KubeStatus,
  NotKubernetesApiError,
  ResourceNotInstalledError,
} from "./errors.ts";

/** A Kubernetes resource type: where its objects live in the API. */
export interface KubeResource {
  /** The API group; `""` for the core group (`/api/v1`). */
  readonly group: string;
  /** The version, e.g. `v2`. */
  readonly version: string;
  /** The plural resource name, e.g. `ciliumidentities`. */
  readonly plural: string;
  /** Whether objects live in a namespace (`Lease`) or cluster-wide (`CiliumIdentity`). */
  readonly namespaced: boolean;
}

/** The RBAC verbs of the client's calls. */
export type KubeVerb = "get" | "list" | "watch" | "create" | "update" | "patch" | "delete";

/** What a failed request was, for messages. */
export interface FailureContext {
  /** The server URL. */
  readonly server: string;
  /** Where the connection settings came from (`KubeConnection.source`). */
  readonly source: string;
  /** The RBAC verb of the request (absent for `/version`). */
  readonly verb?: KubeVerb;
  /** The resource (absent for `/version`). */
  readonly resource?: KubeResource;
  /** The namespace of a namespaced request. */
  readonly namespace?: string;
  /** The object's name, if the request named one. */
  readonly name?: string;
}

/** `<plural>.<group>`, or `<plural>` for the core group: how `kubectl` and RBAC name a resource. */
export function resourceName(resource: KubeResource): string {
  return resource.group === "" ? resource.plural : `${resource.plural}.${resource.group}`;
}

/** The ready-to-paste RBAC rule granting `verb` on `resource` (YAML flow style, one line). */
export function rbacRule(resource: KubeResource, verbs: readonly KubeVerb[]): string {
  const list = (xs: readonly string[]) => `[${xs.map((x) => JSON.stringify(x)).join(", ")}]`;
  return `{apiGroups: ${list([resource.group])}, resources: ${list([resource.plural])}, ` +
    `verbs: ${list(verbs)}}`;
}

/** A Kubernetes `Status` in `text`, or `undefined` when the body is not one. */
export function parseStatus(contentType: string, text: string): KubeStatus | undefined {
  if (!contentType.includes("json")) return undefined;
  try {
    const body = JSON.parse(text) as KubeStatus | null;
    return body !== null && typeof body === "object" && body.kind === "Status" ? body : undefined;
  } catch {
    return undefined;
  }
}

/** What a non-Kubernetes answer looks like, in a few words. */
function describeAnswer(status: number, contentType: string, text: string): string {
  if (/"etcdserver"\s*:/.test(text)) return "an etcd server's client port answers there";
  const kind = contentType.split(";")[0] || "no content type";
  const title = /<title>([^<]{1,80})<\/title>/i.exec(text)?.[1];
  return `it answered HTTP ${status} (${kind}${title ? `, "${title.trim()}"` : ""})`;
}

/** The error for an answer whose body shows that no Kubernetes API server sent it. */
export function notKubernetes(
  ctx: FailureContext,
  status: number,
  contentType: string,
  text: string,
  overPlainHttp?: { readonly cause: unknown },
): NotKubernetesApiError {
  return new NotKubernetesApiError(
    `${ctx.server} (${ctx.source}) is not a Kubernetes API server: ` +
      (overPlainHttp ? "it does not speak TLS, and over plain HTTP " : "") +
      describeAnswer(status, contentType, text),
    overPlainHttp,
  );
}

/**
 * Statuses that say "not now" whoever sends them: 502 Bad Gateway, 503 Service Unavailable, 504
 * Gateway Timeout. Proxies and load balancers in front of an API server send them as plain text or
 * HTML, and the scale bench met a 504 `text/plain` at load 57: the request may pass on the next
 * try, so a body that is no `Status` does not make the server "not Kubernetes".
 */
const GATEWAY_FAILURES: ReadonlySet<number> = new Set([502, 503, 504]);

/**
 * The retryable error for a 502/503/504 whose body is no Kubernetes `Status` (see
 * {@linkcode GATEWAY_FAILURES}); the answer's first line is quoted.
 */
function gatewayFailure(
  ctx: FailureContext,
  status: number,
  contentType: string,
  text: string,
): StoreUnavailableError {
  const kind = contentType.split(";")[0] || "no content type";
  const title = /<title>([^<]{1,80})<\/title>/i.exec(text)?.[1]?.trim();
  const line = title ?? text.trim().split("\n", 1)[0].slice(0, 120);
  return new StoreUnavailableError(
    `${ctx.server} (${ctx.source}) answered HTTP ${status} (${kind}` +
      `${line ? `, "${line}"` : ""}): the API server, or a proxy or load balancer in front of ` +
      "it, is unavailable or timed out",
  );
}

/** The version Cilium v1.16 serves each of its CRDs that idalloc reads as, and its CRD file. */
const CILIUM_CRDS: Readonly<Record<string, string>> = {
  ciliumidentities: "v2",
  ciliumendpoints: "v2",
  ciliumendpointslices: "v2alpha1",
};

/** How to get `res` served, in words: one clause naming the fix. */
function installHint(res: KubeResource): string {
  const ciliumVersion = res.group === "cilium.io" ? CILIUM_CRDS[res.plural] : undefined;
  if (ciliumVersion !== undefined) {
    const apply = `kubectl apply -f pkg/k8s/apis/cilium.io/client/crds/${ciliumVersion}/` +
      `${res.plural}.yaml of Cilium's source (Cilium's operator installs it when it starts)`;
    return ciliumVersion === res.version
      ? `install Cilium's CRD: ${apply}`
      : `Cilium serves ${res.plural}.cilium.io as ${ciliumVersion}, not ${res.version}: name ` +
        `${res.plural}.cilium.io/${ciliumVersion} (its CRD: ${apply})`;
  }
  if (res.group === "" || res.group.endsWith(".k8s.io")) {
    return `this API server does not serve ${res.group || "core"}/${res.version}: it is too old ` +
      "or the API is turned off";
  }
  return "install its CustomResourceDefinition (kubectl apply -f <its CRD manifest>) and wait " +
    "until it is Established";
}

function missingResource(ctx: FailureContext): ResourceNotInstalledError {
  const res = ctx.resource!;
  const name = resourceName(res);
  return new ResourceNotInstalledError(
    `${ctx.server} (${ctx.source}) does not serve ${name}/${res.version}: ${installHint(res)}`,
    name,
  );
}

/** The user name in the API server's 403 message (`User "bob" cannot …`), if it says. */
function deniedUser(message: string): string | undefined {
  return /User "([^"]*)"/.exec(message)?.[1];
}

/**
 * The error for a user that may not use `verbs` on the context's resource: it names the user (when
 * known), the verbs, the resource and its scope, and the RBAC rule to add, ready to paste.
 */
export function accessDenied(
  ctx: FailureContext & { readonly resource: KubeResource },
  verbs: readonly KubeVerb[],
  user: string | undefined,
  cause?: unknown,
): StoreAccessDeniedError {
  const res = ctx.resource;
  const scope = !res.namespaced
    ? "cluster-wide"
    : ctx.namespace === undefined
    ? "in all namespaces"
    : `in namespace ${ctx.namespace}`;
  const role = res.namespaced && ctx.namespace !== undefined
    ? `a Role in namespace ${ctx.namespace} (or a ClusterRole)`
    : "a ClusterRole";
  const who = user !== undefined ? `user "${user}"` : `the user of ${ctx.source}`;
  return new StoreAccessDeniedError(
    `${who} may not ${verbs.join(", ")} ${resourceName(res)} ${scope} on ${ctx.server} ` +
      `(403 Forbidden): add the rule ${rbacRule(res, verbs)} to ${role} bound to ` +
      `${user ?? "that user"}`,
    { cause },
  );
}

function forbidden(ctx: FailureContext, status: KubeStatus, cause: KubeApiError): IdallocError {
  const { resource, verb } = ctx;
  if (resource === undefined || verb === undefined) {
    return new StoreAccessDeniedError(
      `${ctx.server} (${ctx.source}) refused the request (403 Forbidden): ${status.message}`,
      { cause },
    );
  }
  return accessDenied({ ...ctx, resource }, [verb], deniedUser(status.message ?? ""), cause);
}

/**
 * The error for a failure answer: `status` and `contentType` of the response, `text` its body.
 * `kubernetes` says whether this server was already seen answering `/version` as Kubernetes: a
 * plain-text 404 from it means the resource is not installed, from anything else that the server
 * is not Kubernetes.
 */
export function answerFailure(
  status: number,
  contentType: string,
  text: string,
  ctx: FailureContext,
  kubernetes = true,
): IdallocError {
  const body = parseStatus(contentType, text);
  if (body === undefined) {
    if (/Client sent an HTTP request to an HTTPS server/i.test(text)) {
      return new StoreTlsError(
        `${ctx.server} (${ctx.source}) speaks TLS: use https:// in the server URL`,
        "tls-required",
      );
    }
    // The API server's mux answers an unknown group, version or resource so.
    if (kubernetes && status === 404 && ctx.resource && /404 page not found/.test(text)) {
      return missingResource(ctx);
    }
    if (GATEWAY_FAILURES.has(status)) return gatewayFailure(ctx, status, contentType, text);
    return notKubernetes(ctx, status, contentType, text);
  }
  const err = KubeApiError.fromStatus(body, status);
  if (err.code === 401) {
    return new StoreAccessDeniedError(
      `${ctx.server} refused the credentials of ${ctx.source} (401 Unauthorized): the token or ` +
        "client certificate is not valid for this API server (expired, revoked, or another cluster's)",
      { cause: err },
    );
  }
  if (err.code === 403) return forbidden(ctx, body, err);
  return err;
}

/** The causes of `err` from the outermost in (Deno's `fetch` puts the reason in `cause`). */
function causeChain(err: unknown): string {
  const parts: string[] = [];
  let current: unknown = err;
  for (let i = 0; i < 5 && current !== undefined && current !== null; i++) {
    const code = (current as { code?: unknown }).code;
    parts.push(`${typeof code === "string" ? `${code} ` : ""}${errorMessage(current)}`);
    current = (current as { cause?: unknown }).cause;
  }
  return parts.join(": ");
}

/** The stack's reason without its framing (`error sending request for url (…): client error (Connect): `). */
function summarize(text: string): string {
  return text
    .replace(/^(TypeError: )?fetch failed: /i, "")
    .replace(/error sending request (?:from \S+ )?for url \([^)]*\): /i, "")
    .replace(/client error \(Connect\): /i, "")
    .replace(/:[^:]*\.c:\d+:\s*$/s, "")
    .trim();
}

/** What kind of transport failure `err` is. */
export type TransportFailureKind = "refused" | "unresolved" | "tls" | "reset" | "other";

/** Classifies a transport error (Deno's `fetch`, `node:https`). */
export function transportFailureKind(err: unknown): TransportFailureKind {
  const text = causeChain(err);
  if (/ECONNREFUSED|Connection refused|os error 111/i.test(text)) return "refused";
  if (/ENOTFOUND|EAI_AGAIN|dns error|failed to lookup address|getaddrinfo/i.test(text)) {
    return "unresolved";
  }
  // A peer gone mid-handshake (rustls: "…without sending TLS close_notify", unexpected-eof) is
  // a server stopping or starting, not a TLS setup problem.
  if (/close_notify|unexpected.eof/i.test(text)) return "reset";
  // A connection closed before the peer sent one byte of TLS: a kube-apiserver that has bound its
  // port but is not serving yet does that during a restart. Measured on loopback (a port that
  // accepts and closes): node:https says "Client network socket disconnected before secure TLS
  // connection was established" (ECONNRESET), Deno's fetch "tls handshake eof". It says nothing
  // about the peer's protocol; one that answers in plain text is told by the bytes it sent ("wrong
  // version number", rustls' InvalidContentType), below.
  if (/disconnected before secure TLS|tls handshake eof/i.test(text)) return "reset";
  if (
    /certificate|handshake|SSL|TLS|self.signed|unable to verify|InvalidContentType|EPROTO|UnknownIssuer|NotValidForName/i
      .test(text)
  ) {
    return "tls";
  }
  if (
    /ECONNRESET|EPIPE|ERR_SOCKET_CLOSED|socket hang up|socket is closed|connection closed|connection reset|broken pipe/i
      .test(text)
  ) {
    return "reset";
  }
  return "other";
}

/**
 * The typed error for a request that got no answer: `err` is the transport's error; `tls` the
 * configured CA and server name (for the words). An abort by the caller is never passed here.
 */
export function transportFailure(
  err: unknown,
  ctx: FailureContext,
  tls: { readonly ca?: string; readonly cert?: string; readonly serverName?: string },
): IdallocError {
  const where = `${ctx.server} (${ctx.source})`;
  const text = causeChain(err);
  switch (transportFailureKind(err)) {
    case "refused":
      return new StoreConnectionRefusedError(
        `${where} refused the connection: nothing listens on that port (is the API server up?)`,
        { cause: err },
      );
    case "unresolved": {
      const host = new URL(ctx.server).hostname;
      return new StoreHostNotFoundError(`cannot resolve the host name ${host} (${where})`, host, {
        cause: err,
      });
    }
    case "tls":
      return tlsFailure(err, where, text, tls);
    case "reset":
      return new StoreUnavailableError(
        `${where} closed the connection without an answer (${summarize(text)})`,
        { cause: err },
      );
    default:
      return new StoreUnavailableError(`${where}: ${summarize(text)}`, { cause: err });
  }
}

function tlsFailure(
  err: unknown,
  where: string,
  text: string,
  tls: { readonly ca?: string; readonly cert?: string; readonly serverName?: string },
): StoreTlsError {
  const problem = tlsProblemOf(new Error(text));
  let message: string;
  switch (problem) {
    case "untrusted":
      message = tls.ca === undefined
        ? `${where}: the server's certificate is not signed by a CA this system trusts, and ` +
          "no certificate-authority is given"
        : `${where}: the server's certificate is not signed by the CA given ` +
          "(certificate-authority)";
      break;
    case "name-mismatch":
      message = `${where}: the server's certificate is not valid for the name ` +
        `${tls.serverName ?? new URL(where.split(" ")[0]).hostname}`;
      break;
    case "client-certificate":
      message = `${where} refused the TLS handshake: it wants a client certificate it trusts`;
      break;
    case "not-tls":
      message = `${where} does not speak TLS (a plain-text server answers there)`;
      break;
    default:
      message = `${where}: TLS handshake failed (${summarize(text)})`;
  }
  return new StoreTlsError(message, problem, { cause: err });
}
