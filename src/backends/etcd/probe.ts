/**
 * A second look at an endpoint that closed gRPC's connection without a word: grpc-js then reports
 * only `ECONNRESET` or `EPIPE` (or, by chance, "Protocol error"), the same for an HTTP/1 server,
 * a TLS-only etcd reached without TLS, and a member that went away. One plain connection that
 * sends HTTP/2's preface and reads the first reply, and if need be one TLS handshake, tell them
 * apart. Both are bounded in time and closed before returning.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a server listening at the address (tests/backends/etcd/connect_errors.test.ts)
 * const verdict = await probePlainEndpoint("http://127.0.0.1:8080", 500); // "http1"
 * ```
 *
 * @module
 */

/**
 * What answers at an endpoint reached without TLS: an HTTP/1 server, a plain-text HTTP/2 server
 * (etcd without TLS answers so), a TLS server, or unknown.
 */
export type PlainProbeVerdict = "http1" | "h2" | "tls" | undefined;

/** HTTP/2's connection preface and an empty SETTINGS frame: what grpc-js sends first. */
const PREFACE = new Uint8Array([
  ...new TextEncoder().encode("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
  0,
  0,
  0,
  4,
  0,
  0,
  0,
  0,
  0,
]);

/** `promise`, or `undefined` after `ms`; `onLate` closes what it would have returned. */
async function within<T>(
  promise: Promise<T>,
  ms: number,
  onLate: (value: T) => void,
): Promise<T | undefined> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let late = false;
  const timeout = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => {
      late = true;
      resolve(undefined);
    }, ms);
  });
  promise.then((v) => late && onLate(v), () => {});
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

function close(conn: Deno.Conn): void {
  try {
    conn.close();
  } catch {
    // already closed
  }
}

/** The first bytes the server sends after HTTP/2's preface, or `undefined` (closed, silent). */
async function firstReply(
  hostname: string,
  port: number,
  ms: number,
): Promise<Uint8Array | undefined> {
  const conn = await within(Deno.connect({ hostname, port }), ms, close).catch(() => undefined);
  if (conn === undefined) return undefined;
  try {
    await conn.write(PREFACE);
    const buf = new Uint8Array(16);
    const n = await within(conn.read(buf), ms, () => {});
    return n ? buf.subarray(0, n) : undefined;
  } catch {
    return undefined;
  } finally {
    close(conn);
  }
}

/** Whether the server completes or fails a TLS handshake on a certificate (it speaks TLS). */
async function speaksTls(hostname: string, port: number, ms: number): Promise<boolean> {
  const conn = await within(Deno.connectTls({ hostname, port }), ms, close).catch(() => undefined);
  if (conn === undefined) return false;
  try {
    await within(conn.handshake(), ms, () => {});
    return true;
  } catch (err) {
    // The server sent a certificate we do not trust (a private CA): it speaks TLS all the same.
    return /certificate|UnknownIssuer|NotValidForName|invalid peer/i.test(String(err));
  } finally {
    close(conn);
  }
}

/**
 * What answers at `endpoint` (its host and port; the scheme is ignored) when it closes gRPC's
 * connection without a word: `"http1"` for an HTTP/1 server, `"h2"` for a plain-text HTTP/2
 * server (a SETTINGS frame first, as etcd without TLS sends), `"tls"` for a server that speaks
 * TLS, else `undefined`. Each step waits at most `ms`.
 */
export async function probePlainEndpoint(endpoint: string, ms: number): Promise<PlainProbeVerdict> {
  const url = new URL(endpoint);
  const hostname = url.hostname.replace(/^\[|\]$/g, "");
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  const reply = await firstReply(hostname, port, ms);
  if (reply !== undefined && new TextDecoder().decode(reply).startsWith("HTTP/")) return "http1";
  // An HTTP/2 frame header: 3 bytes of length, then the type, 4 for SETTINGS.
  if (reply !== undefined && reply.length >= 4 && reply[3] === 4) return "h2";
  if (reply === undefined && await speaksTls(hostname, port, ms)) return "tls";
  return undefined;
}
