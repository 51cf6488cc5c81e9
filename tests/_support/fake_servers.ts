/**
 * Servers on loopback that are not etcd, for the connection-failure tests: an HTTP/1 server and
 * an HTTP/2 (h2c) server, both answering 404 to everything.
 *
 * @example
 * ```ts ignore
 * // Needs the etcd backend and a listening port; tests/backends/etcd/connect_errors.test.ts runs it.
 * await using h2 = await http2Server();
 * await EtcdBackend.connect({ endpoints: [h2.url], node: "n" }); // NotEtcdServerError
 * ```
 * @module
 */
import http from "node:http";
import http2 from "node:http2";
import type { AddressInfo } from "node:net";

/** A running server on 127.0.0.1. */
export interface FakeServer extends AsyncDisposable {
  /** Its port. */
  readonly port: number;
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
}

function started(
  server: http.Server | http2.Http2Server,
  onClose: () => void,
): Promise<FakeServer> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as AddressInfo).port;
      resolve({
        port,
        url: `http://127.0.0.1:${port}`,
        [Symbol.asyncDispose]: () =>
          new Promise<void>((done) => {
            onClose();
            server.close(() => done());
          }),
      });
    });
  });
}

/** An HTTP/1.1 server (node:http) that answers 404. */
export function http1Server(): Promise<FakeServer> {
  const server = http.createServer((_req, res) => {
    res.writeHead(404, { connection: "close" });
    res.end("not here\n");
  });
  return started(server, () => server.closeAllConnections());
}

/**
 * A plain-text HTTP/2 server (node:http2, prior knowledge as gRPC uses) that answers 404, with
 * `body` (an error page) or none.
 */
export function http2Server(body = ""): Promise<FakeServer> {
  const server = http2.createServer();
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
  });
  server.on("stream", (stream: http2.ServerHttp2Stream) => {
    stream.respond({ ":status": 404 });
    stream.end(body);
  });
  return started(server, () => {
    for (const session of sessions) session.destroy();
  });
}

/** A loopback port that accepts connections and never speaks: no refusal, no answer. */
export function silentServer(): FakeServer {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const held: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) held.push(conn);
  })().catch(() => {});
  const port = listener.addr.port;
  return {
    port,
    url: `http://127.0.0.1:${port}`,
    async [Symbol.asyncDispose]() {
      for (const conn of held) conn.close();
      listener.close();
      await accepting;
    },
  };
}
