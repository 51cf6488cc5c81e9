/**
 * etcd client failures in words an operator reads: gRPC's status text (`14 UNAVAILABLE: No
 * connection established. Last error: Error: connect ECONNREFUSED …. Resolution note:`) becomes
 * "connection refused", "cannot resolve the host name", "no answer", "TLS handshake failed". The
 * raw error stays the `cause`.
 *
 * @example
 * ```ts
 * import { summarize } from "./failure.ts";
 * const raw = new Error("14 UNAVAILABLE: No connection established. Last error: Error: connect ECONNREFUSED 127.0.0.1:1. Resolution note:");
 * console.log(summarize(raw)); // connection refused
 * ```
 *
 * @module
 */

/** What kind of connection failure `err` is, if one. */
export type ConnectionFailure = "refused" | "unresolved" | "timeout" | "tls";

/** Classifies a client error as a connection failure, or `undefined` for anything else. */
export function connectionFailureOf(err: unknown): ConnectionFailure | undefined {
  const text = err instanceof Error ? err.message : String(err);
  if (/ECONNREFUSED|connection refused/i.test(text)) return "refused";
  if (/name resolution failed|ENOTFOUND|EAI_AGAIN|getaddrinfo|DNS resolution/i.test(text)) {
    return "unresolved";
  }
  if (/certificate|handshake|SSL|TLS|self.signed|unable to verify/i.test(text)) return "tls";
  if (/deadline exceeded|DEADLINE_EXCEEDED|timed? ?out/i.test(text)) return "timeout";
  return undefined;
}

const WORDS: Readonly<Record<ConnectionFailure, string>> = {
  refused: "connection refused",
  unresolved: "cannot resolve the host name",
  timeout: "no answer",
  tls: "TLS handshake failed",
};

/** `err` in a few plain words: a connection failure by kind, else its text without gRPC noise. */
export function summarize(err: unknown): string {
  const kind = connectionFailureOf(err);
  if (kind !== undefined) return WORDS[kind];
  const text = err instanceof Error ? err.message : String(err);
  return text
    .replace(/^\d+ [A-Z_]+: /, "")
    .replace(/\s*Resolution note:.*$/s, "")
    .replace(/^etcdserver: /, "")
    .trim();
}
