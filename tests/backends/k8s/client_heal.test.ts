/**
 * A transport that heals, against a real kube-apiserver behind a loopback TCP forwarder that
 * stalls its connections (stops moving bytes without closing them, as a swapped load balancer or
 * a dropped NAT entry does: kubernetes#87615): the read-idle ping finds the connection dead, the
 * pool is rebuilt, a read in flight is sent again on the new one and a watch fails fast (to be
 * watched again) instead of hanging until the kernel gives up on the socket. And `Retry-After` on
 * a 429, from a loopback server that asks for it; a 401 whose credential refresh fails leaves no
 * request open for the health check to ping for.
 */
import assert from "node:assert/strict";
import { chmod, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createKubeClient } from "../../../src/backends/k8s/client.ts";
import {
  identityResource,
  sharedKubeApiServer,
} from "../../../src/backends/k8s/testing/cluster.ts";
import { StoreUnavailableError } from "../../../src/errors.ts";
import { test } from "../../_support/test.ts";
import { apiServerTests } from "./_client_support.ts";
import { startForwarder } from "./_proxies.ts";
import { backoffDelay } from "../../../src/allocator/backoff.ts";
import { WATCH_BACKOFF } from "../../../src/backends/k8s/watch.ts";

const k8sTest = apiServerTests("heal");

function randomBytes(n: number): Uint8Array {
  return crypto.getRandomValues(new Uint8Array(n));
}
const CILIUM = identityResource();

/** `promise`, or a rejection naming `what` after `ms`: a hang fails the test instead of stalling it. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`${what}: still waiting after ${ms} ms`)), ms);
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

k8sTest(
  "a stalled connection: the pool is rebuilt, a list succeeds, a watch fails fast",
  async () => {
    const cluster = await sharedKubeApiServer();
    await using forwarder = await startForwarder(new URL(cluster.server).host);
    const server = `https://${forwarder.address}`;
    await using client = await createKubeClient(
      { ...cluster.connection("admin"), server },
      { requestTimeoutMs: 20_000, healthCheckIdleMs: 1_000, pingTimeoutMs: 1_000 },
    );
    // Three lists at once: over HTTP/1.1 (node:https, as with a kubeconfig CA) the pool then holds
    // idle connections that the stall catches too, so later requests land on dead ones.
    const [{ resourceVersion }] = await Promise.all(
      [1, 2, 3].map(() => client.list(CILIUM, { limit: 1 })),
    );
    const controller = new AbortController();
    const events = client.watch(CILIUM, { resourceVersion, signal: controller.signal })
      [Symbol.asyncIterator]();
    const first = events.next();
    first.catch(() => {}); // asserted below; it may fail before the list comes back
    // Let the watch's request reach the server, then stall every connection open now.
    await new Promise((resolve) => setTimeout(resolve, 300));
    const before = forwarder.accepted;
    forwarder.stall();
    try {
      // A read in flight on the dead connection: sent again on a new one, well before its timeout.
      const list = await within(client.list(CILIUM, { limit: 1 }), 15_000, "the list");
      assert.ok(list.resourceVersion);
      assert.ok(forwarder.accepted > before, "a new connection was opened");
      // The watch on the dead connection ends with the retryable error: the caller watches again.
      await within(
        assert.rejects(first, (err) => err instanceof StoreUnavailableError),
        15_000,
        "the watch",
      );
      const again = client.watch(CILIUM, {
        resourceVersion: list.resourceVersion,
        signal: controller.signal,
      });
      const name = `${10_000 + Math.floor(Math.random() * 50_000)}`;
      await client.create(CILIUM, { metadata: { name }, "security-labels": { "k8s:heal": "x" } });
      for await (const event of again) {
        if (event.object.metadata.name === name) break;
      }
      await client.delete(CILIUM, name);
    } finally {
      controller.abort();
      await events.return?.(undefined);
    }
  },
);

test("k8s heal: a 429 with Retry-After is waited out and sent again", async () => {
  const seen: number[] = [];
  const server = createServer((_req, res) => {
    seen.push(Date.now());
    if (seen.length === 1) {
      res.writeHead(429, { "content-type": "application/json", "retry-after": "1" });
      res.end(
        JSON.stringify({
          kind: "Status",
          code: 429,
          reason: "TooManyRequests",
          message: "slow down",
        }),
      );
      return;
    }
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ kind: "List", items: [], metadata: { resourceVersion: "7" } }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  try {
    await using client = await createKubeClient({
      server: `http://127.0.0.1:${port}`,
      namespace: "default",
      source: "test",
    });
    const list = await client.list(CILIUM);
    assert.equal(list.resourceVersion, "7");
    assert.equal(seen.length, 2);
    assert.ok(seen[1] - seen[0] >= 900, `waited ${seen[1] - seen[0]} ms, Retry-After said 1 s`);
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

k8sTest(
  "a large list on a slow link: the request timeout bounds silence, not the body",
  async () => {
    const cluster = await sharedKubeApiServer();
    await using admin = await cluster.client();
    const run = crypto.randomUUID().slice(0, 8);
    const names = Array.from(
      { length: 30 },
      () => `${100_000 + Math.floor(Math.random() * 900_000)}`,
    );
    const unique = [...new Set(names)];
    for (const name of unique) {
      await admin.create(CILIUM, {
        metadata: { name, labels: { "idalloc-heal": run } },
        // Random bytes: the API server gzips a large answer for a client that accepts it.
        "security-labels": { "k8s:blob": btoa(String.fromCharCode(...randomBytes(3072))) },
      });
    }
    try {
      await using forwarder = await startForwarder(new URL(cluster.server).host);
      await using client = await createKubeClient(
        { ...cluster.connection("admin"), server: `https://${forwarder.address}` },
        { requestTimeoutMs: 1_000 },
      );
      await client.list(CILIUM, { limit: 1 }); // the connection, at full speed
      // About 130 KiB at 8 KiB every 200 ms: over 3 s in all, never 1 s without a byte.
      forwarder.slow(8192, 200);
      const list = await client.list(CILIUM, { labelSelector: `idalloc-heal=${run}` });
      assert.equal(list.items.length, unique.length);
    } finally {
      for (const name of unique) {
        await admin.delete(CILIUM, name);
      }
    }
  },
);

test("k8s heal: the informer's reconnect backoff is jittered and grows to client-go's 30 s", () => {
  // The ceiling after many failures in a row, and a draw below it: never the same fixed step.
  assert.equal(backoffDelay(WATCH_BACKOFF, 20, () => 1), 30_000);
  assert.equal(backoffDelay(WATCH_BACKOFF, 20, () => 0.5), 15_000);
  assert.equal(backoffDelay(WATCH_BACKOFF, 0, () => 1), WATCH_BACKOFF.initialMs);
});

test("k8s heal: a 401 whose credential refresh fails leaves nothing open for the health check", async () => {
  // An exec plugin that gives a token once, then fails: the server refuses the token (401), the
  // client runs the plugin again, and that fails. The refused response must be released, or the
  // pool's health check takes it for a silent request and pings (and, on node:https, rebuilds the
  // pool, failing every request in flight) every idle period for the client's lifetime.
  const dir = await mkdtemp(join(tmpdir(), "idalloc-k8s-heal-"));
  const pings: number[] = [];
  const server = createServer((req, res) => {
    if (req.url === "/version") pings.push(Date.now());
    res.writeHead(401, { "content-type": "application/json" });
    res.end(JSON.stringify({ kind: "Status", code: 401, reason: "Unauthorized", message: "no" }));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  try {
    const script = join(dir, "plugin.sh");
    await writeFile(
      script,
      `#!/bin/sh
echo run >> "${dir}/runs"
[ "$(wc -l < "${dir}/runs")" -gt 1 ] && { echo "logged out" >&2; exit 1; }
echo '{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential", "status": {"token": "t"}}'
`,
    );
    await chmod(script, 0o755);
    await using client = await createKubeClient({
      server: `http://127.0.0.1:${port}`,
      namespace: "default",
      source: "test",
      exec: {
        command: script,
        args: [],
        env: {},
        apiVersion: "client.authentication.k8s.io/v1",
        interactiveMode: "Never",
      },
    }, { healthCheckIdleMs: 100, pingTimeoutMs: 1_000 });
    const err = await client.list(CILIUM).then(() => undefined, (e) => e);
    assert.equal(err?.name, "CredentialPluginError", String(err));
    // While the plugin ran, the 401 was open and silent: pinged for, rightly. After the call, many
    // idle periods with nothing in flight: a leaked request would be pinged for.
    const during = pings.length;
    await new Promise((resolve) => setTimeout(resolve, 1_000));
    assert.equal(
      pings.length,
      during,
      "no health-check ping after the call: nothing was left open",
    );
  } finally {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
    await rm(dir, { recursive: true, force: true });
  }
});
