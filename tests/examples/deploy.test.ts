/**
 * The Deploy example's HTTP API with `fetch` against `Deno.serve({ port: 0 })`, on a real Deno KV
 * file; two isolates sharing it; and `deno task deploy:dev` as a process.
 */
import assert from "node:assert/strict";
import { main as cli } from "../../src/cli/main.ts";
import { createHandler, IdentityService } from "../../examples/deploy/main.ts";
import { ChildOutput } from "../_support/child_output.ts";
import { Labels } from "../../src/identity/mod.ts";
import { freePort } from "../../src/backends/etcd/testing/cluster.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const JSON_TYPE = { "content-type": "application/json" };
const WEB = ["k8s:io.kubernetes.pod.namespace=prod", "k8s:app=web"];

/** A temp dir with a KV file, a service (one isolate) and a server on a free loopback port. */
class Isolate implements AsyncDisposable {
  readonly base: string;
  readonly service: IdentityService;
  readonly #kv: Deno.Kv;
  readonly #server: Deno.HttpServer<Deno.NetAddr>;
  readonly #stop = new AbortController();

  private constructor(kv: Deno.Kv, service: IdentityService) {
    this.#kv = kv;
    this.service = service;
    this.#server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      createHandler(service, { signal: this.#stop.signal }),
    );
    this.base = `http://127.0.0.1:${this.#server.addr.port}`;
  }

  static async open(path: string, node: string): Promise<Isolate> {
    const kv = await Deno.openKv(path);
    const service = await IdentityService.open(kv, {
      node,
      leaseTtlMs: 2_000,
      reconcileMs: 60_000,
      gcIntervalMs: 0,
      pollIntervalMs: 50,
      maxClockSkewMs: 200,
    });
    await service.reconcile();
    return new Isolate(kv, service);
  }

  fetch(path: string, init?: RequestInit): Promise<Response> {
    return fetch(`${this.base}${path}`, init);
  }

  /** The status of a request whose body does not matter. */
  async status(path: string, init?: RequestInit): Promise<number> {
    const res = await this.fetch(path, init);
    await res.body?.cancel();
    return res.status;
  }

  async post(body: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
    const res = await this.fetch("/v1/identities", {
      method: "POST",
      headers: JSON_TYPE,
      body: JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() };
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.#stop.abort();
    await this.#server.shutdown();
    await this.service.close();
    this.#kv.close();
  }
}

async function withDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-deploy-" });
  try {
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("deploy: POST, GET and DELETE identities", () =>
  withDir(async (dir) => {
    await using isolate = await Isolate.open(`${dir}/ids.kv`, "isolate-a");
    const created = await isolate.post({ labels: WEB });
    assert.equal(created.status, 201);
    const id = created.body.id as number;
    assert.ok(id >= 256 && id <= 65535);
    assert.deepEqual(created.body, {
      id,
      labels: ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"],
      isNew: true,
    });
    const again = await isolate.post({ labels: [...WEB].reverse() });
    assert.equal(again.status, 200);
    assert.deepEqual(again.body, { ...created.body, isNew: false });

    const get = await isolate.fetch(`/v1/identities/${id}`);
    assert.equal(get.status, 200);
    assert.deepEqual(await get.json(), { id, labels: created.body.labels });
    const host = await isolate.fetch("/v1/identities/1");
    assert.deepEqual(await host.json(), { id: 1, labels: ["reserved:host"] });
    const reserved = await isolate.post({ labels: ["reserved:host"] });
    assert.deepEqual([reserved.status, reserved.body.id], [200, 1]);

    const list = await isolate.fetch("/v1/identities");
    assert.deepEqual(await list.json(), { identities: [{ id, labels: created.body.labels }] });

    const deleted = await isolate.fetch(`/v1/identities/${id}`, { method: "DELETE" });
    assert.equal(deleted.status, 200);
    assert.deepEqual(await deleted.json(), { id, labels: created.body.labels, released: true });
    assert.deepEqual(await (await isolate.fetch("/v1/identities")).json(), { identities: [] });
    const twice = await isolate.fetch(`/v1/identities/${id}`, { method: "DELETE" });
    assert.equal(twice.status, 404);
    assert.equal((await twice.json()).error.code, "not_found");
    // The identity itself stays until GC: released, not deleted.
    assert.equal(await isolate.status(`/v1/identities/${id}`), 200);
    assert.deepEqual(isolate.service.status(), {
      node: "isolate-a",
      held: 0,
      reconciled: true,
    });
  }));

Deno.test("deploy: bad input gets a 4xx JSON error", () =>
  withDir(async (dir) => {
    await using isolate = await Isolate.open(`${dir}/ids.kv`, "isolate-a");
    const post = (body: string, type = "application/json") =>
      isolate.fetch("/v1/identities", { method: "POST", headers: { "content-type": type }, body });
    const cases: Array<[Promise<Response>, number, string]> = [
      [post("{}", "text/plain"), 415, "unsupported_media_type"],
      [post("{not json"), 400, "invalid_json"],
      [post("{}"), 400, "invalid_request"],
      [post(JSON.stringify({ labels: [] })), 400, "invalid_request"],
      [post(JSON.stringify({ labels: ["k8s:app=web"], extra: 1 })), 400, "invalid_request"],
      [post(JSON.stringify({ labels: [42] })), 400, "invalid_request"],
      [post(JSON.stringify({ labels: ["k8s:a;b"] })), 400, "invalid_labels"],
      [post(JSON.stringify({ labels: ["cidr:10.0.0.0/8"] })), 422, "node_local_labels"],
      [post(JSON.stringify({ labels: ["x".repeat(70_000)] })), 413, "body_too_large"],
      [isolate.fetch("/v1/identities/abc"), 400, "invalid_id"],
      [isolate.fetch("/v1/identities/0"), 400, "invalid_id"],
      [isolate.fetch("/v1/identities/99999"), 404, "not_found"],
      [isolate.fetch("/v1/identities", { method: "PUT" }), 405, "method_not_allowed"],
      [isolate.fetch("/v1/status", { method: "POST" }), 405, "method_not_allowed"],
      [isolate.fetch("/v1/status", { method: "DELETE" }), 405, "method_not_allowed"],
      [post(JSON.stringify({ labels: ["k8s:a=b", "k8s:a=c"] })), 400, "invalid_labels"],
      [isolate.fetch("/v1/nope"), 404, "not_found"],
    ];
    for (const [pending, status, code] of cases) {
      const res = await pending;
      assert.equal(res.status, status, code);
      assert.match(res.headers.get("content-type") ?? "", /^application\/json/);
      const body = await res.json();
      assert.equal(body.error.code, code);
      assert.equal(typeof body.error.message, "string");
      if (status === 405) assert.ok(res.headers.get("allow"), "405 names the allowed methods");
    }
    const badId = await (await isolate.fetch("/v1/identities/abc")).json();
    assert.equal(badId.error.message, 'an identity ID is a positive whole number, got "abc"');
  }));

Deno.test("deploy: a bad label is a 400 naming it, the verdict of the library and the CLI", () =>
  withDir(async (dir) => {
    await using isolate = await Isolate.open(`${dir}/ids.kv`, "isolate-a");
    // Issue 28: this body got 201 with `k8s:=x` silently gone.
    const issue = await isolate.post({ labels: ["no-colon", "k8s:=x", "k8s:a=b=c"] });
    assert.equal(issue.status, 400, JSON.stringify(issue.body));
    assert.deepEqual(issue.body, {
      error: {
        code: "invalid_labels",
        message: 'label "k8s:=x" has an empty key: write [source:]key[=value], e.g. k8s:app=web',
      },
    });
    assert.deepEqual(await (await isolate.fetch("/v1/identities")).json(), { identities: [] });

    // One parser, one verdict: the library's `Labels.parse`, the CLI and the service agree on
    // every label list, and refuse with the same words.
    const cases = [
      ["no-colon", "k8s:a=b=c"],
      ["k8s:=x"],
      ["=x"],
      ["k8s:"],
      ["k8s:app=web", ""],
      ["k8s:a;b"],
      ["k8s:a=b", "k8s:a=c"],
      ["$host"],
    ];
    const io = () => {
      const out = { stdout: "", stderr: "" };
      return {
        out,
        stdout: { write: (t: string) => void (out.stdout += t) },
        stderr: { write: (t: string) => void (out.stderr += t) },
      };
    };
    for (const labels of cases) {
      let library: string | undefined;
      try {
        Labels.parse(labels);
      } catch (err) {
        library = (err as Error).message;
      }
      const served = await isolate.post({ labels });
      const cliIo = io();
      const code = await cli(
        ["--store", `kv:${dir}/cli.kv`, "identity", "allocate", "--json", "--", ...labels],
        cliIo,
      );
      const what = JSON.stringify(labels);
      if (library === undefined) {
        assert.ok(served.status < 300, `${what}: service ${JSON.stringify(served.body)}`);
        assert.equal(code, 0, `${what}: CLI ${cliIo.out.stderr}`);
        continue;
      }
      assert.equal(served.status, 400, `${what}: service ${JSON.stringify(served.body)}`);
      assert.deepEqual(served.body, { error: { code: "invalid_labels", message: library } });
      assert.equal(code, 1, `${what}: CLI ${cliIo.out.stdout}`);
      assert.equal(JSON.parse(cliIo.out.stderr).error.message, library, what);
    }
  }));

/** Reads server-sent events until `until` returns true for one. */
async function readEvents(
  reader: ReadableStreamDefaultReader<string>,
  events: Array<{ event: string; data: unknown }>,
  until: (e: { event: string; data: unknown }) => boolean,
  buffer: { text: string },
): Promise<void> {
  for (;;) {
    let end: number;
    while ((end = buffer.text.indexOf("\n\n")) >= 0) {
      const block = buffer.text.slice(0, end);
      buffer.text = buffer.text.slice(end + 2);
      const event = /^event: (.*)$/m.exec(block)?.[1];
      const data = /^data: (.*)$/m.exec(block)?.[1];
      if (event === undefined || data === undefined) continue;
      const parsed = { event, data: JSON.parse(data) };
      events.push(parsed);
      if (until(parsed)) return;
    }
    const { value, done } = await reader.read();
    if (done) throw new Error(`event stream ended: ${JSON.stringify(events)}`);
    buffer.text += value;
  }
}

Deno.test("deploy: ?watch streams identities as Server-Sent Events", () =>
  withDir(async (dir) => {
    await using isolate = await Isolate.open(`${dir}/ids.kv`, "isolate-a");
    const web = (await isolate.post({ labels: WEB })).body.id as number;
    const res = await isolate.fetch("/v1/identities?watch");
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type") ?? "", /^text\/event-stream/);
    const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
    const events: Array<{ event: string; data: unknown }> = [];
    const buffer = { text: "" };
    try {
      await readEvents(reader, events, (e) => e.event === "synced", buffer);
      assert.deepEqual(events, [
        {
          event: "added",
          data: { id: web, labels: ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"] },
        },
        { event: "synced", data: {} },
      ]);
      const db = (await isolate.post({ labels: ["k8s:app=db"] })).body.id as number;
      await readEvents(reader, events, (e) =>
        e.event === "added" && (e.data as { id: number }).id === db, buffer);
      assert.deepEqual(events.at(-1), { event: "added", data: { id: db, labels: ["k8s:app=db"] } });
      // Another isolate's identity reaches this stream only through the store's watch, after the
      // echo of db's master: once it is here, db would have been announced a second time.
      await using other = await Isolate.open(`${dir}/ids.kv`, "isolate-b");
      const api = (await other.post({ labels: ["k8s:app=api"] })).body.id as number;
      await readEvents(reader, events, (e) =>
        e.event === "added" && (e.data as { id: number }).id === api, buffer);
      const dbAdds = events.filter((e) =>
        e.event === "added" && (e.data as { id: number }).id === db
      );
      assert.equal(dbAdds.length, 1, "every new identity is announced once");
    } finally {
      await reader.cancel();
    }
  }));

Deno.test("deploy: a second isolate references every claimed identity; a released claim is dropped", () =>
  withDir(async (dir) => {
    const path = `${dir}/ids.kv`;
    await using a = await Isolate.open(path, "isolate-a");
    const web = (await a.post({ labels: WEB })).body.id as number;
    const db = (await a.post({ labels: ["k8s:app=db"] })).body.id as number;
    await using b = await Isolate.open(path, "isolate-b");
    assert.equal(b.service.status().held, 2, "a new isolate takes a reference to every claim");
    const usage = async () => {
      let out = "";
      const code = await cli(
        ["--store", `kv:${path}`, "--prefix", "deploy/identities", "status", "--usage", "--json"],
        { stdout: { write: (t) => void (out += t) }, stderr: { write: () => {} } },
      );
      assert.equal(code, 0);
      return JSON.parse(out);
    };
    const status = await usage();
    assert.deepEqual(status.usage, { inUse: 2, unused: 0 });
    assert.deepEqual(
      status.nodes.map((n: { node: string }) => n.node).sort(),
      ["isolate-a", "isolate-b"],
    );

    // a's client deletes db: a drops its claim and reference; b drops its own at its reconcile.
    assert.equal(await a.status(`/v1/identities/${db}`, { method: "DELETE" }), 200);
    await b.service.reconcile();
    assert.equal(b.service.status().held, 1);
    assert.deepEqual((await usage()).usage, { inUse: 1, unused: 1 });
    // b serves what a created.
    assert.deepEqual(await (await b.fetch(`/v1/identities/${web}`)).json(), {
      id: web,
      labels: ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"],
    });
  }));

Deno.test("deploy: `deno task deploy:dev` serves on loopback and stops on SIGTERM", () =>
  withDir(async (dir) => {
    const port = await freePort();
    const child = new Deno.Command(Deno.execPath(), {
      args: ["task", "-q", "deploy:dev"],
      cwd: ROOT,
      env: { PORT: String(port), IDALLOC_KV_PATH: `${dir}/dev.kv` },
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const output = new ChildOutput(child, "deploy:dev");
    try {
      await output.until(`http://127.0.0.1:${port}/`);
      const res = await fetch(`http://127.0.0.1:${port}/v1/identities`, {
        method: "POST",
        headers: JSON_TYPE,
        body: JSON.stringify({ labels: WEB }),
      });
      assert.equal(res.status, 201);
      const { id } = await res.json();
      const status = await (await fetch(`http://127.0.0.1:${port}/v1/status`)).json();
      assert.match(status.node, /^deploy-local-dev-[0-9a-f]{8}$/);
      assert.equal(status.held, 1);
      const got = await fetch(`http://127.0.0.1:${port}/v1/identities/${id}`);
      assert.equal(got.status, 200);
      await got.body?.cancel();
      child.kill("SIGTERM");
      await output.toEnd();
    } finally {
      output.kill();
    }
    const { code } = await child.status;
    assert.equal(code, 0, await output.stderr);
    assert.match(output.text, /stopped/);
  }));
