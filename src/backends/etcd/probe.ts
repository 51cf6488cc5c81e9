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
import { connect as connectPlain, type Socket } from "node:net";
import { connect as connectTls } from "node:tls";

/**
 * What answers at an endpoint reached without TLS: an HTTP/1 server (`"http1"`: it answers with
 * an HTTP status line), a server that answers something else that is not HTTP/2 (`"not-h2"`, such
 * as Python's `http.server`, whose reply to HTTP/2's preface is an HTML page without a status
 * line), a plain-text HTTP/2 server (etcd without TLS answers so), a TLS server, or unknown.
 */
export type PlainProbeVerdict = "http1" | "not-h2" | "h2" | "tls" | undefined;

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

/**
 * Opens `socket`, waits for `settle` to call back (at most `ms`), then destroys the socket: the
 * probe's one shape, on `node:net` and `node:tls` (which Deno, Node.js and Bun all have).
 */
function probeSocket<T>(
  open: () => Socket,
  ms: number,
  fallback: T,
  settle: (socket: Socket, done: (value: T) => void) => void,
): Promise<T> {
  return new Promise<T>((resolve) => {
    let socket: Socket | undefined;
    let finished = false;
    const done = (value: T) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      socket?.destroy();
      resolve(value);
    };
    const timer = setTimeout(() => done(fallback), ms);
    try {
      socket = open();
    } catch {
      done(fallback);
      return;
    }
    socket.on("error", () => done(fallback));
    socket.on("close", () => done(fallback));
    settle(socket, done);
  });
}

/** The first bytes the server sends after HTTP/2's preface, or `undefined` (closed, silent). */
function firstReply(host: string, port: number, ms: number): Promise<Uint8Array | undefined> {
  return probeSocket<Uint8Array | undefined>(
    () => connectPlain({ host, port }),
    ms,
    undefined,
    (socket, done) => {
      socket.once("connect", () => socket.write(PREFACE));
      socket.once("data", (chunk: Uint8Array) => done(chunk.subarray(0, 16)));
    },
  );
}

/**
 * Whether the server completes a TLS handshake. The certificate is not judged (a private CA's
 * server speaks TLS all the same): nothing is sent over this connection.
 */
function speaksTls(host: string, port: number, ms: number): Promise<boolean> {
  return probeSocket(
    () => connectTls({ host, port, rejectUnauthorized: false }),
    ms,
    false,
    (socket, done) => socket.once("secureConnect", () => done(true)),
  );
}

/** Whether `reply` starts like a TLS record (an alert or a handshake, TLS 1.x). */
function tlsRecord(reply: Uint8Array): boolean {
  return reply.length >= 2 && (reply[0] === 0x15 || reply[0] === 0x16) && reply[1] === 0x03;
}

/**
 * What answers at `endpoint` (its host and port; the scheme is ignored) when it closes gRPC's
 * connection without a word: `"http1"` for an HTTP/1 server, `"not-h2"` for any other reply that
 * is not HTTP/2 (an HTTP/2 server must open with a SETTINGS frame, RFC 9113 §3.4), `"h2"` for a
 * plain-text HTTP/2 server (a SETTINGS frame first, as etcd without TLS sends), `"tls"` for a
 * server that speaks TLS, else `undefined` (nothing was said). Each step waits at most `ms`.
 *
 * The verdict depends only on what the server says to the preface, never on how gRPC's own
 * connection happened to end (with "Protocol error" when grpc-js read the server's reply first,
 * with a reset when the server closed first): so one server gets one classification every time.
 */
export async function probePlainEndpoint(endpoint: string, ms: number): Promise<PlainProbeVerdict> {
  const url = new URL(endpoint);
  const hostname = url.hostname.replace(/^\[|\]$/g, "");
  const port = Number(url.port || (url.protocol === "https:" ? 443 : 80));
  const reply = await firstReply(hostname, port, ms);
  if (reply === undefined || reply.length === 0) {
    return await speaksTls(hostname, port, ms) ? "tls" : undefined;
  }
  if (new TextDecoder().decode(reply).startsWith("HTTP/")) return "http1";
  // An HTTP/2 frame header: 3 bytes of length, then the type, 4 for SETTINGS.
  if (reply.length >= 4 && reply[3] === 4) return "h2";
  // A TLS server that answers plain text with an alert speaks TLS all the same.
  if (tlsRecord(reply)) return "tls";
  return "not-h2";
}
