/**
 * Loopback proxies for the client tests: an HTTP `CONNECT` proxy (a kubeconfig's `proxy-url`)
 * that counts its tunnels, and a TCP forwarder to the API server that can stall its connections
 * (stop forwarding without closing: the peer that stops answering of kubernetes#87615), drop them,
 * or refuse new ones. Built on `node:net` so that they run on every runtime.
 */
import { connect, createServer, type Server, type Socket } from "node:net";

/** A running proxy. */
export interface LoopbackProxy extends AsyncDisposable {
  /** Its address, `127.0.0.1:<port>`. */
  readonly address: string;
  /** Connections (tunnels) it accepted so far. */
  readonly accepted: number;
  /** Stops listening and closes every connection. */
  close(): Promise<void>;
}

/** The TCP forwarder of {@linkcode startForwarder}. */
export interface Forwarder extends LoopbackProxy {
  /** Stops moving bytes on every open connection, in both directions, and keeps them open. */
  stall(): void;
  /** Closes every open connection (new ones are forwarded). */
  drop(): void;
  /**
   * From now on, passes the server's bytes to the client `pieceBytes` at a time, one piece every
   * `delayMs` (a slow link: the answer keeps coming, slowly).
   */
  slow(pieceBytes: number, delayMs: number): void;
}

async function listen(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return `127.0.0.1:${port}`;
}

function closer(server: Server, sockets: Set<Socket>): () => Promise<void> {
  let closed: Promise<void> | undefined;
  return () =>
    closed ??= new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    });
}

/** How {@linkcode pipe} passes the bytes of `b` to `a`. */
interface Pace {
  readonly pieceBytes: number;
  readonly delayMs: number;
}

/**
 * Pipes `a` and `b` both ways, unless `stalled()` says to swallow the bytes; `pace()` slows what
 * `b` sends to `a`.
 */
function pipe(
  a: Socket,
  b: Socket,
  stalled: () => boolean,
  pace: () => Pace | undefined = () => undefined,
): void {
  a.on("data", (chunk) => {
    if (!stalled()) b.write(chunk);
  });
  let queue = Buffer.alloc(0);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const pump = () => {
    timer = undefined;
    const p = pace();
    if (p === undefined || queue.length === 0) return;
    a.write(queue.subarray(0, p.pieceBytes));
    queue = queue.subarray(p.pieceBytes);
    if (queue.length > 0) timer = setTimeout(pump, p.delayMs);
  };
  b.on("data", (chunk: Buffer) => {
    if (stalled()) return;
    if (pace() === undefined) return void a.write(chunk);
    queue = Buffer.concat([queue, chunk]);
    if (timer === undefined) pump();
  });
  const end = () => {
    clearTimeout(timer);
    a.destroy();
    b.destroy();
  };
  a.on("close", end).on("error", end);
  b.on("close", end).on("error", end);
}

/** An HTTP CONNECT proxy on loopback. */
export async function startConnectProxy(): Promise<LoopbackProxy> {
  const sockets = new Set<Socket>();
  let accepted = 0;
  const server = createServer((client) => {
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    let head = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      head = Buffer.concat([head, chunk]);
      const end = head.indexOf("\r\n\r\n");
      if (end < 0) return;
      client.off("data", onData);
      const [method, authority] = head.subarray(0, end).toString().split(" ");
      if (method !== "CONNECT") {
        client.end("HTTP/1.1 405 Method Not Allowed\r\n\r\n");
        return;
      }
      const [host, port] = [
        authority.slice(0, authority.lastIndexOf(":")),
        authority.slice(authority.lastIndexOf(":") + 1),
      ];
      const upstream = connect(Number(port), host, () => {
        accepted++;
        client.write("HTTP/1.1 200 Connection Established\r\n\r\n");
        const rest = head.subarray(end + 4);
        if (rest.length > 0) upstream.write(rest);
        pipe(client, upstream, () => false);
      });
      sockets.add(upstream);
      upstream.on("close", () => sockets.delete(upstream));
      upstream.on("error", () => client.destroy());
    };
    client.on("data", onData);
    client.on("error", () => client.destroy());
  });
  const address = await listen(server);
  const close = closer(server, sockets);
  return {
    address,
    get accepted() {
      return accepted;
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}

/** A TCP forwarder from loopback to `target` (`host:port`). */
export async function startForwarder(target: string): Promise<Forwarder> {
  const sockets = new Set<Socket>();
  /** The connections stalled so far (new ones are forwarded). */
  const stalled = new WeakSet<Socket>();
  const open = new Set<Socket>();
  let accepted = 0;
  let pace: Pace | undefined;
  const at = target.lastIndexOf(":");
  const server = createServer((client) => {
    accepted++;
    const upstream = connect(Number(target.slice(at + 1)), target.slice(0, at));
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
    }
    open.add(client);
    client.on("close", () => open.delete(client));
    pipe(client, upstream, () => stalled.has(client), () => pace);
  });
  const address = await listen(server);
  const close = closer(server, sockets);
  return {
    address,
    get accepted() {
      return accepted;
    },
    stall() {
      for (const c of open) stalled.add(c);
    },
    drop() {
      for (const c of open) c.destroy();
    },
    slow(pieceBytes, delayMs) {
      pace = { pieceBytes, delayMs };
    },
    close,
    [Symbol.asyncDispose]: close,
  };
}
