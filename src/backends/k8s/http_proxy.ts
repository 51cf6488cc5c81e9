/**
 * A `proxy-url` on the `node:http(s)` stack (Node.js, Bun, and Deno when it cannot use `fetch`):
 * every new connection is an HTTP `CONNECT` tunnel through the proxy (an `http://` or `https://`
 * proxy, with the URL's user and password as basic auth), then TLS to the API server inside it.
 * Deno's `fetch` takes the proxy itself (`Deno.createHttpClient({ proxy })`), socks5 included.
 *
 * @example
 * ```ts ignore
 * // ignored: needs a proxy; tests/backends/k8s/client_proxy.test.ts runs one.
 * const agent = await tunnelAgent("http://127.0.0.1:3128", true, { keepAlive: true, ca });
 * ```
 *
 * @module
 */
import type { Agent, AgentOptions } from "node:http";
import type { Socket } from "node:net";
import { InvalidOptionsError } from "../../errors.ts";

type Connected = (err: Error | null, socket?: Socket) => void;

/** A keep-alive agent whose connections go through the proxy at `proxyUrl`. */
export async function tunnelAgent(
  proxyUrl: string,
  secure: boolean,
  options: AgentOptions & Record<string, unknown>,
): Promise<Agent> {
  const proxy = new URL(proxyUrl);
  if (proxy.protocol !== "http:" && proxy.protocol !== "https:") {
    throw new InvalidOptionsError(
      `proxy-url ${proxyUrl}: only http:// and https:// proxies work on this runtime's HTTP ` +
        "stack (socks5 works on Deno with a verified certificate)",
    );
  }
  const http = await import("node:http");
  const https = await import("node:https");
  const tls = await import("node:tls");
  const proxyLib = proxy.protocol === "https:" ? https : http;
  const auth = proxy.username === "" ? {} : {
    "proxy-authorization": `Basic ${
      btoa(`${decodeURIComponent(proxy.username)}:${decodeURIComponent(proxy.password)}`)
    }`,
  };
  const agent = secure ? new https.Agent(options) : new http.Agent(options);
  // The callback form of createConnection: the agent waits for the tunnel before it sends.
  (agent as unknown as { createConnection: typeof createConnection }).createConnection =
    createConnection;
  return agent;

  function createConnection(
    target: Record<string, unknown> & { host?: string; port?: number | string },
    done: Connected,
  ): undefined {
    const authority = `${target.host}:${target.port}`;
    const req = proxyLib.request({
      host: proxy.hostname,
      port: proxy.port || (proxy.protocol === "https:" ? 443 : 80),
      method: "CONNECT",
      path: authority,
      headers: { host: authority, ...auth },
      agent: false,
    });
    req.once("connect", (res, socket) => {
      if (res.statusCode !== 200) {
        socket.destroy();
        done(new Error(`the proxy ${proxy.host} refused the tunnel: HTTP ${res.statusCode}`));
        return;
      }
      if (!secure) return done(null, socket);
      const tunnel = tls.connect(
        {
          ...target,
          socket,
          servername: (target.servername as string | undefined) ?? target.host,
        } as import("node:tls").ConnectionOptions,
      );
      tunnel.once("secureConnect", () => done(null, tunnel));
      tunnel.once("error", (err) => done(err));
    });
    req.once("error", (err) => done(err));
    req.end();
    return undefined;
  }
}
