/**
 * etcd client failures in words an operator reads: gRPC's status text (`14 UNAVAILABLE: No
 * connection established. Last error: Error: connect ECONNREFUSED …. Resolution note:`) becomes
 * "connection refused", "cannot resolve the host name", "no answer", "TLS handshake failed", and
 * {@linkcode typedFailure} turns the failures that have a class of their own into it (see
 * `errors.ts`), naming the endpoint. The raw error stays the `cause`.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { summarize } from "./failure.ts";
 * const raw = new Error("14 UNAVAILABLE: No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:1. Resolution note:");
 * assert.equal(summarize(raw), "connection refused");
 * ```
 *
 * @module
 */
import type { IdallocError } from "../../errors.ts";
import type { PlainProbeVerdict } from "./probe.ts";
import {
  AuthNotEnabledError,
  NotEtcdServerError,
  StoreConnectionRefusedError,
  StoreHostNotFoundError,
  StoreTlsError,
} from "./errors.ts";
import { tlsProblemOf } from "../shared/tls.ts";
import { errorMessage } from "../../errors.ts";

/**
 * What kind of connection failure `err` is, if one: nothing listening, a name that does not
 * resolve, no answer, TLS, a server that is not etcd, or a connection closed without an answer.
 */
export type ConnectionFailure = "refused" | "unresolved" | "timeout" | "tls" | "not-etcd" | "reset";

/** Classifies a client error as a connection failure, or `undefined` for anything else. */
export function connectionFailureOf(err: unknown): ConnectionFailure | undefined {
  const text = errorMessage(err);
  if (/ECONNREFUSED|connection refused/i.test(text)) return "refused";
  if (/name resolution failed|ENOTFOUND|EAI_AGAIN|getaddrinfo|DNS resolution/i.test(text)) {
    return "unresolved";
  }
  if (/certificate|handshake|SSL|TLS|self.signed|unable to verify|servername/i.test(text)) {
    return "tls";
  }
  // grpc-js's words for an HTTP/1 reply to its HTTP/2 preface ("Protocol error"), an HTTP/2
  // server's non-gRPC answer ("Received HTTP status code 404"), or a gRPC server without etcd's
  // services ("unknown service etcdserverpb.…").
  // A 5xx from a proxy in front of etcd says etcd is down, not absent: that stays unclassified.
  if (
    /Protocol error|Received HTTP status code 4\d\d|unknown service etcdserverpb|content-type/i
      .test(text)
  ) {
    return "not-etcd";
  }
  // "Failed to connect": grpc-js's words for an HTTP/2 session closed before it was set up.
  if (/ECONNRESET|EPIPE|socket hang up|Failed to connect/i.test(text)) return "reset";
  if (/deadline exceeded|DEADLINE_EXCEEDED|timed? ?out/i.test(text)) return "timeout";
  return undefined;
}

const WORDS: Readonly<Record<ConnectionFailure, string>> = {
  refused: "connection refused",
  unresolved: "cannot resolve the host name",
  timeout: "no answer",
  tls: "TLS handshake failed",
  "not-etcd": "not an etcd server",
  reset: "connection closed without an answer",
};

/** `err` in a few plain words: a connection failure by kind, else its text without gRPC noise. */
export function summarize(err: unknown): string {
  const kind = connectionFailureOf(err);
  if (kind !== undefined) return WORDS[kind];
  return errorMessage(err)
    .replace(/^\d+ [A-Z_]+: /, "")
    .replace(/\s*Resolution note:.*$/s, "")
    .replace(/^etcdserver: /, "")
    .trim();
}

/** The host name grpc-js failed to resolve (`… for target dns:HOST:PORT`), if it says. */
function unresolvedHost(err: unknown): string | undefined {
  return /for target (?:dns:)?(?:\/\/\/)?\[?([^\]\s:]+)\]?(?::\d+)?/i.exec(errorMessage(err))?.[1];
}

/** The certificate's names from Node's altname message (`… in the cert's altnames: IP …`). */
function certificateNames(err: unknown): string | undefined {
  return /cert's altnames: (.*?)\.?\s*(?:Resolution note|$)/is.exec(errorMessage(err))?.[1]?.trim();
}

/** Where the failure happened, for messages: `etcd at http://a:2379, http://b:2379`. */
export function endpointWords(endpoints: readonly string[]): string {
  return `etcd at ${endpoints.join(", ")}`;
}

/**
 * The typed error for a client failure that has a class of its own (see `errors.ts`), with a
 * message naming `endpoints`; `undefined` for any other failure (and for a timeout, whose
 * message the caller words with its own deadline). `tls` says whether TLS was configured.
 */
export function typedFailure(
  err: unknown,
  endpoints: readonly string[],
  tls: { readonly serverName?: string } | undefined,
): IdallocError | undefined {
  const where = endpointWords(endpoints);
  const text = errorMessage(err);
  if (/authentication is not enabled/i.test(text)) {
    return new AuthNotEnabledError(
      `${where} has authentication turned off, but a user name and password were given`,
      { cause: err },
    );
  }
  switch (connectionFailureOf(err)) {
    case "refused":
      return new StoreConnectionRefusedError(
        `${where} refused the connection: nothing listens on that port`,
        { cause: err },
      );
    case "unresolved": {
      const host = unresolvedHost(err) ?? new URL(endpoints[0]).hostname;
      return new StoreHostNotFoundError(
        `cannot resolve the host name ${host} (${where})`,
        host,
        { cause: err },
      );
    }
    case "not-etcd":
      return notEtcd(where, summarizeNotEtcd(text), err);
    case "tls":
      return tlsError(err, where, endpoints, tls);
    default:
      return undefined;
  }
}

/**
 * The typed error for a connection that the server(s) closed without an answer, given what
 * `probePlainEndpoint` found when it looked again without TLS (`verdict`); `undefined` when
 * nothing more is known. With TLS, a server that answers plain HTTP does not speak TLS; one that
 * closes the handshake without a word while no client certificate was given most likely
 * demands one (etcd's `--client-cert-auth`).
 */
export function resetFailure(
  err: unknown,
  endpoints: readonly string[],
  tls: { readonly cert?: string } | undefined,
  verdict: PlainProbeVerdict,
): IdallocError | undefined {
  const where = endpointWords(endpoints);
  if (tls !== undefined && (verdict === "h2" || verdict === "http1" || verdict === "not-h2")) {
    return new StoreTlsError(
      `${where} does not speak TLS (a plain-text etcd?)`,
      "not-tls",
      { cause: err },
    );
  }
  if (verdict === "http1" || verdict === "not-h2") {
    // The same words as when grpc-js itself read the reply ("Protocol error"): which of the two
    // happens is a race between the server's reply and its close.
    return notEtcd(where, NOT_HTTP2, err);
  }
  if (tls === undefined && verdict === "tls") {
    return new StoreTlsError(
      `${where} speaks TLS, but the connection was made without TLS (no CA was given)`,
      "tls-required",
      { cause: err },
    );
  }
  if (tls !== undefined && tls.cert === undefined) {
    return new StoreTlsError(
      `${where} closed the connection during the TLS handshake: it most likely demands a client ` +
        "certificate (mutual TLS), and none was given",
      "client-certificate",
      { cause: err },
    );
  }
  return undefined;
}

/** What a server that answers HTTP/2's preface with something else than HTTP/2 is told. */
const NOT_HTTP2 = "it does not speak HTTP/2: an HTTP/1 server?";

function notEtcd(where: string, why: string, err: unknown): NotEtcdServerError {
  return new NotEtcdServerError(
    `${where} is not an etcd server: something answers there, but not etcd's gRPC API (${why})`,
    { cause: err },
  );
}

function summarizeNotEtcd(text: string): string {
  if (/Protocol error/i.test(text)) return NOT_HTTP2;
  const status = /Received HTTP status code (\d+)/i.exec(text);
  if (status) return `HTTP status ${status[1]} to a gRPC request`;
  return "it lacks etcd's services";
}

function tlsError(
  err: unknown,
  where: string,
  endpoints: readonly string[],
  tls: { readonly serverName?: string } | undefined,
): StoreTlsError {
  const problem = tlsProblemOf(err);
  const name = tls?.serverName ?? new URL(endpoints[0]).hostname;
  let message: string;
  switch (problem) {
    case "ip-server-name":
      message = `${where}: TLS cannot verify the server by its IP address ${name} ` +
        "(Deno's TLS sends no IP address as server name)";
      break;
    case "name-mismatch": {
      const names = certificateNames(err);
      message = `${where}: the server certificate is not valid for the name ${name}` +
        (names ? ` (it names ${names})` : "");
      break;
    }
    case "untrusted":
      message = `${where}: the server certificate is not signed by the CA given`;
      break;
    case "client-certificate":
      message = `${where} refused the TLS handshake: it wants a client certificate it trusts`;
      break;
    case "not-tls":
      message = `${where} does not speak TLS (a plain-text etcd?)`;
      break;
    default:
      message = `${where}: TLS handshake failed (${summarizeTls(err)})`;
  }
  return new StoreTlsError(message, problem, { cause: err });
}

function summarizeTls(err: unknown): string {
  return errorMessage(err)
    .replace(/^\d+ [A-Z_]+: /, "")
    .replace(/^No connection established\. Last error: /, "")
    .replace(/\s*Resolution note:.*$/s, "")
    .trim();
}
