/**
 * What the `k8s-scale` bench reads from the API server beside the nodes, by plain HTTPS with the
 * admin token — not through idalloc's client, so that its figures are the server's and stay
 * right whatever the backend's layout: the request counters in `/metrics`, an object's size as
 * served, a watch whose bytes it counts, and collection deletes between scenarios.
 *
 * @module
 */
import { readFile } from "node:fs/promises";
import type { KubeTestCluster } from "../src/backends/k8s/testing/cluster.ts";
import { type RequestCounts, requestCounts } from "./k8s_scale_table.ts";

/** A request of the bench's own that the API server refused. */
export class ScaleApiError extends Error {
  /** Its HTTP status. */
  readonly status: number;

  /** @param what The request. @param status Its HTTP status. @param body The server's answer. */
  constructor(what: string, status: number, body: string) {
    super(`${what}: HTTP ${status}: ${body.slice(0, 500)}`);
    this.name = "ScaleApiError";
    this.status = status;
  }
}

/** The bytes and events a watch received: in all, and per object name. */
export interface WatchTally {
  /** Every byte of the watch's body. */
  readonly bytes: number;
  readonly events: number;
  /** Bytes and events per object name (a line is an event; its bytes with the newline). */
  readonly byName: ReadonlyMap<string, { readonly bytes: number; readonly events: number }>;
}

/** A running watch counting what it receives; stop it to read the tally. */
export interface WatchCounter {
  /** Ends the watch; what it received. */
  stop(): Promise<WatchTally>;
}

/** Plain HTTPS to a test API server as `admin`. */
export class ApiProbe implements Disposable {
  readonly #server: string;
  readonly #token: string;
  readonly #client: Deno.HttpClient;

  private constructor(server: string, token: string, ca: string) {
    this.#server = server;
    this.#token = token;
    this.#client = Deno.createHttpClient({ caCerts: [ca] });
  }

  /** A probe of `cluster`'s server. */
  static async of(cluster: KubeTestCluster): Promise<ApiProbe> {
    return new ApiProbe(
      cluster.server,
      cluster.token("admin"),
      await readFile(cluster.caFile, "utf8"),
    );
  }

  async #request(method: string, path: string, signal?: AbortSignal): Promise<Response> {
    const res = await fetch(`${this.#server}${path}`, {
      method,
      client: this.#client,
      headers: { authorization: `Bearer ${this.#token}`, accept: "application/json" },
      signal,
    });
    if (!res.ok) throw new ScaleApiError(`${method} ${path}`, res.status, await res.text());
    return res;
  }

  /** The request counters now (`apiserver_request_total`, by verb and resource). */
  async requests(): Promise<RequestCounts> {
    return requestCounts(await (await this.#request("GET", "/metrics")).text());
  }

  /** `path`'s body as the server sends it (JSON), or its size. */
  async text(path: string): Promise<string> {
    return await (await this.#request("GET", path)).text();
  }

  /** Deletes every object of a collection (`deletecollection`). */
  async deleteAll(path: string): Promise<void> {
    await (await this.#request("DELETE", path)).body?.cancel();
  }

  /**
   * Watches the collection at `path` from its current resource version and counts the bytes
   * and events that come, until stopped.
   */
  async watch(path: string): Promise<WatchCounter> {
    const list = JSON.parse(await this.text(`${path}?limit=1`)) as {
      metadata: { resourceVersion: string };
    };
    const abort = new AbortController();
    const res = await this.#request(
      "GET",
      `${path}?watch=1&resourceVersion=${list.metadata.resourceVersion}`,
      abort.signal,
    );
    let bytes = 0;
    let events = 0;
    const byName = new Map<string, { bytes: number; events: number }>();
    const reading = (async () => {
      let line = "";
      const decoder = new TextDecoder();
      const encoder = new TextEncoder();
      try {
        for await (const chunk of res.body!) {
          bytes += chunk.byteLength;
          line += decoder.decode(chunk, { stream: true });
          let nl;
          while ((nl = line.indexOf("\n")) >= 0) {
            const event = line.slice(0, nl);
            line = line.slice(nl + 1);
            events++;
            // The object's name is the first `"name":` of the event (metadata comes first).
            const name = /"name":"([^"]*)"/.exec(event)?.[1] ?? "";
            const seen = byName.get(name) ?? { bytes: 0, events: 0 };
            seen.bytes += encoder.encode(event).byteLength + 1;
            seen.events++;
            byName.set(name, seen);
          }
        }
      } catch (err) {
        if (!abort.signal.aborted) throw err;
      }
    })();
    return {
      async stop() {
        abort.abort();
        await reading;
        return { bytes, events, byName };
      },
    };
  }

  /** Closes the HTTP client. */
  [Symbol.dispose](): void {
    this.#client.close();
  }
}
