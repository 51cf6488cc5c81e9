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
  /** How often the server ended the watch and it was opened again from the last version. */
  readonly reopened: number;
  /** How often that version had expired (events missed: the figures are then a lower bound). */
  readonly expired: number;
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
   * and events that come, until stopped. As an informer does, it watches again from the last
   * version it saw when the server ends the watch (a loaded server closes watchers it finds slow),
   * and from a fresh list when that version has expired (the events between are then not
   * counted: {@linkcode WatchTally.expired} says how often).
   */
  async watch(path: string): Promise<WatchCounter> {
    const abort = new AbortController();
    const tally = { bytes: 0, events: 0, reopened: 0, expired: 0 };
    const byName = new Map<string, { bytes: number; events: number }>();
    const encoder = new TextEncoder();
    const latest = async () =>
      (JSON.parse(await this.text(`${path}?limit=1`)) as { metadata: { resourceVersion: string } })
        .metadata.resourceVersion;
    let version = await latest();
    /** One event's line: counted; false when it says the version expired. */
    const count = (event: string): boolean => {
      if (event.startsWith('{"type":"ERROR"')) return !/"code":410/.test(event);
      version = /"resourceVersion":"(\d+)"/.exec(event)?.[1] ?? version;
      if (event.startsWith('{"type":"BOOKMARK"')) return true;
      tally.events++;
      // The object's name is the first `"name":` of the event (metadata comes first).
      const name = /"name":"([^"]*)"/.exec(event)?.[1] ?? "";
      const seen = byName.get(name) ?? { bytes: 0, events: 0 };
      seen.bytes += encoder.encode(event).byteLength + 1;
      seen.events++;
      byName.set(name, seen);
      return true;
    };
    const once = async (): Promise<void> => {
      const res = await this.#request(
        "GET",
        `${path}?watch=1&allowWatchBookmarks=true&resourceVersion=${version}`,
        abort.signal,
      );
      const decoder = new TextDecoder();
      let line = "";
      for await (const chunk of res.body!) {
        tally.bytes += chunk.byteLength;
        line += decoder.decode(chunk, { stream: true });
        let nl;
        while ((nl = line.indexOf("\n")) >= 0) {
          const event = line.slice(0, nl);
          line = line.slice(nl + 1);
          if (!count(event)) throw new ScaleApiError(`watch ${path}`, 410, event);
        }
      }
    };
    const reading = (async () => {
      while (!abort.signal.aborted) {
        try {
          await once();
          if (!abort.signal.aborted) tally.reopened++;
        } catch (err) {
          if (abort.signal.aborted) return;
          if (err instanceof ScaleApiError && err.status === 410) {
            tally.expired++;
            version = await latest();
          } else if (err instanceof ScaleApiError) {
            throw err;
          } else {
            // The connection broke (a loaded server drops it): as the server ending the watch.
            tally.reopened++;
          }
        }
      }
    })();
    // Read at stop(); until then a failure must not go unhandled.
    reading.catch(() => {});
    return {
      async stop() {
        abort.abort();
        await reading;
        return { ...tally, byName };
      },
    };
  }

  /** Closes the HTTP client. */
  [Symbol.dispose](): void {
    this.#client.close();
  }
}
