/**
 * A loopback TCP proxy that loses one answer: armed with a byte pattern, it forwards the first
 * request bytes that contain it to the real server, drops everything the server sends back on
 * that connection from then on, and closes the connection half a second later (time for a
 * loopback server to apply the request: closing at once could cancel it). The write lands in the
 * real store; the client sees a broken connection instead of the answer.
 *
 * @module
 */

const CLOSE_AFTER_MS = 500;

/** Where {@linkcode CuttingProxy} forwards to. */
export interface ProxyTarget {
  readonly hostname: string;
  readonly port: number;
}

/** See the module doc. */
export class CuttingProxy implements AsyncDisposable {
  readonly #listener: Deno.Listener<Deno.TcpConn, Deno.NetAddr>;
  readonly #target: ProxyTarget;
  readonly #conns = new Set<Deno.Conn>();
  readonly #pumps = new Set<Promise<unknown>>();
  #armed: { pattern: Uint8Array; cut: PromiseWithResolvers<void> } | undefined;
  readonly #serving: Promise<void>;

  /** A proxy to `target` on a free loopback port. */
  constructor(target: ProxyTarget) {
    this.#target = target;
    this.#listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    this.#serving = this.#serve();
  }

  /** The proxy's address as an `http://` endpoint. */
  get endpoint(): string {
    return `http://127.0.0.1:${this.#listener.addr.port}`;
  }

  /**
   * Cuts the connection that next sends `pattern` (see the module doc). Resolves once it is cut;
   * one cut per call.
   */
  arm(pattern: string): Promise<void> {
    const cut = Promise.withResolvers<void>();
    this.#armed = { pattern: new TextEncoder().encode(pattern), cut };
    return cut.promise;
  }

  async #serve(): Promise<void> {
    try {
      for await (const client of this.#listener) {
        let server: Deno.Conn;
        try {
          server = await Deno.connect(this.#target);
        } catch {
          client.close();
          continue;
        }
        this.#conns.add(client).add(server);
        const link = { cut: false, closed: Promise.withResolvers<void>() };
        const pumping = Promise.all([
          this.#pump(client, server, (chunk, tail) => this.#matches(chunk, tail, link)),
          this.#pump(server, client, () => link.cut),
        ]);
        this.#pumps.add(pumping);
        void pumping.finally(() => {
          this.#pumps.delete(pumping);
          for (const c of [client, server]) this.#close(c);
        });
        void link.closed.promise.then(() => {
          for (const c of [client, server]) this.#close(c);
        });
      }
    } catch {
      // The listener closed.
    }
  }

  /** Whether the request bytes `chunk` (after `tail`) complete the armed pattern: then cut. */
  #matches(
    chunk: Uint8Array,
    tail: Uint8Array,
    link: { cut: boolean; closed: PromiseWithResolvers<void> },
  ): false {
    const armed = this.#armed;
    if (armed === undefined || link.cut) return false;
    const seen = new Uint8Array(tail.length + chunk.length);
    seen.set(tail);
    seen.set(chunk, tail.length);
    if (indexOf(seen, armed.pattern) < 0) return false;
    this.#armed = undefined;
    link.cut = true;
    setTimeout(() => {
      link.closed.resolve();
      armed.cut.resolve();
    }, CLOSE_AFTER_MS);
    // This chunk is still forwarded: the request reaches the server whole.
    return false;
  }

  /** Copies `from` to `to`, leaving out chunks `drop` says to drop. */
  async #pump(
    from: Deno.Conn,
    to: Deno.Conn,
    drop: (chunk: Uint8Array, tail: Uint8Array) => boolean,
  ): Promise<void> {
    let tail = new Uint8Array(0);
    try {
      for await (const chunk of from.readable) {
        if (drop(chunk, tail)) continue;
        tail = chunk.slice(Math.max(0, chunk.length - 256));
        const writer = to.writable.getWriter();
        try {
          await writer.write(chunk);
        } finally {
          writer.releaseLock();
        }
      }
    } catch {
      // A closed connection ends the pump.
    }
  }

  #close(conn: Deno.Conn): void {
    if (!this.#conns.delete(conn)) return;
    try {
      conn.close();
    } catch { /* already closed */ }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#listener.close();
    for (const c of [...this.#conns]) this.#close(c);
    await this.#serving;
    await Promise.allSettled([...this.#pumps]);
  }
}

function indexOf(haystack: Uint8Array, needle: Uint8Array): number {
  outer: for (let i = 0; i + needle.length <= haystack.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}
