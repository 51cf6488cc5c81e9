/**
 * The Deploy example's `GET /metrics` with `fetch` against `Deno.serve({ port: 0 })`: idalloc's
 * metrics in Prometheus' text format after a create. In a file of its own: the endpoint installs a
 * global meter provider, which is process-wide.
 */
import assert from "node:assert/strict";
import { createHandler, IdentityService, PrometheusMetrics } from "../../examples/deploy/main.ts";

Deno.test("deploy: GET /metrics serves idalloc's metrics as Prometheus text", async () => {
  const dir = await Deno.makeTempDir({ prefix: "idalloc-deploy-metrics-" });
  try {
    await using metrics = PrometheusMetrics.install();
    assert.ok(metrics, "no other global meter provider here");
    using kv = await Deno.openKv(`${dir}/ids.kv`);
    await using service = await IdentityService.open(kv, {
      node: "isolate-m",
      reconcileMs: 60_000,
      gcIntervalMs: 0,
      pollIntervalMs: 50,
      maxClockSkewMs: 200,
      leaseTtlMs: 2_000,
    });
    await service.reconcile();
    const stop = new AbortController();
    await using server = Deno.serve(
      { hostname: "127.0.0.1", port: 0, onListen: () => {} },
      createHandler(service, { signal: stop.signal, metrics }),
    );
    const base = `http://127.0.0.1:${server.addr.port}`;
    const created = await fetch(`${base}/v1/identities`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ labels: ["k8s:app=web"] }),
    });
    assert.equal(created.status, 201);
    await created.body?.cancel();

    const res = await fetch(`${base}/metrics`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
    const text = await res.text();
    const line = (name: string, labels: RegExp) =>
      text.split("\n").find((l) => l.startsWith(`${name}{`) && labels.test(l));
    const labels =
      /idalloc_backend="deno-kv",idalloc_prefix="deploy\/identities",idalloc_node="isolate-m"/;
    assert.match(line("idalloc_allocations_total", /idalloc_outcome="new"/) ?? "", / 1$/);
    assert.match(line("idalloc_allocations_total", labels) ?? "", /./);
    assert.match(line("idalloc_keys_held", labels) ?? "", / 1$/);
    assert.match(
      line(
        "idalloc_store_operations_total",
        /idalloc_store_operation="commit",idalloc_outcome="ok"/,
      ) ??
        "",
      / [1-9][0-9]*$/,
    );
    assert.match(
      line("idalloc_allocation_duration_count", /idalloc_outcome="new"/) ?? "",
      / 1$/,
    );
    assert.match(text, /^# HELP idalloc_allocations_total /m);
    // A service name of its own, not OpenTelemetry's `unknown_service:<deno binary>`.
    if (Deno.env.get("OTEL_SERVICE_NAME") === undefined) {
      assert.match(text, /^target_info\{service_name="idalloc-identity-service",/m);
    }
    const post = await fetch(`${base}/metrics`, { method: "POST" });
    await post.body?.cancel();
    assert.equal(post.status, 405);
    stop.abort();
    await server.shutdown();
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("deploy: OTEL_SERVICE_NAME names the service in /metrics", async () => {
  // In a child process: the meter provider is process-wide, and so is the environment.
  const repo = new URL("../../", import.meta.url).pathname;
  const script = `
    import { PrometheusMetrics } from "./examples/deploy/metrics.ts";
    await using metrics = PrometheusMetrics.install();
    console.log(await metrics.text());
  `;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--ext=ts", script],
    cwd: repo,
    env: { OTEL_SERVICE_NAME: "ids-eu-1" },
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout);
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  assert.match(text, /^target_info\{service_name="ids-eu-1",/m);
});
