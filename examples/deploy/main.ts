/**
 * A Deno Deploy service on Deno KV that hands out Cilium-style security identities:
 * `deno task deploy:dev` runs it locally on `127.0.0.1:$PORT` (default 8000) with a local KV file
 * (`$IDALLOC_KV_PATH`, default `./deploy.kv`); on Deno Deploy the same file runs on the
 * deployment's KV database (`Deno.openKv()` without a path).
 *
 * ```sh
 * curl -s -XPOST localhost:8000/v1/identities -H 'content-type: application/json' \
 *   -d '{"labels": ["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]}'
 * curl -s localhost:8000/v1/identities/1234
 * curl -sN 'localhost:8000/v1/identities?watch'
 * ```
 *
 * Each isolate is one node (`deploy-<timeline>-<deployment>-<random>`); see `service.ts` for what
 * that means for leases and references.
 *
 * Observability: run with `OTEL_DENO=true` (on Deno Deploy: set it as an environment variable)
 * and Deno exports idalloc's metrics and traces over OTLP with no further setup (`OTEL_*`
 * variables choose the endpoint). Without it, `GET /metrics` serves the same metrics in
 * Prometheus' text format (`metrics.ts`).
 *
 * @module
 */
import { ExampleError, exitOnMistakes, openKvFile } from "../mistakes.ts";
import { createHandler } from "./handler.ts";
import { PrometheusMetrics } from "./metrics.ts";
import { IdentityService } from "./service.ts";

export { createHandler, type HandlerOptions } from "./handler.ts";
export { PrometheusMetrics } from "./metrics.ts";
export {
  type CreateResult,
  IdentityService,
  type IdentityServiceOptions,
  NodeLocalLabelsError,
  type ServiceStatus,
} from "./service.ts";

/**
 * This isolate's node name: where and what runs it, plus a random part (isolates come and go).
 * Deno Deploy sets `DENO_TIMELINE` (`production`, `git-branch/<name>`, `preview/<revision>`) and
 * `DENO_DEPLOYMENT_ID`; Deploy Classic (shut down) set `DENO_REGION` instead of a timeline.
 */
export function isolateNode(env: Pick<typeof Deno.env, "get"> = Deno.env): string {
  const clean = (s: string) => s.replace(/[^A-Za-z0-9_.-]/g, "-");
  const where = clean(env.get("DENO_TIMELINE") ?? env.get("DENO_REGION") ?? "local");
  const deployment = clean(env.get("DENO_DEPLOYMENT_ID") ?? "dev").slice(0, 12);
  return `deploy-${where}-${deployment}-${crypto.randomUUID().slice(0, 8)}`;
}

/** The local port: `$PORT` (0 picks a free one), 8000 without it. */
function localPort(): number {
  const text = Deno.env.get("PORT") ?? "8000";
  const port = /^\d{1,5}$/.test(text) ? Number(text) : NaN;
  if (!(port <= 65535)) {
    throw new ExampleError(`PORT must be a port number from 0 to 65535, not '${text}'`);
  }
  return port;
}

/** Serves `handler` on loopback `port`; a port another process has is an {@linkcode ExampleError}. */
function serveLocally(
  port: number,
  handler: Deno.ServeHandler,
  node: string,
): Deno.HttpServer<Deno.NetAddr> {
  try {
    return Deno.serve({
      hostname: "127.0.0.1",
      port,
      onListen: ({ hostname, port }) =>
        console.log(`identity service (node ${node}) on http://${hostname}:${port}/`),
    }, handler);
  } catch (err) {
    if (!(err instanceof Deno.errors.AddrInUse)) throw err;
    throw new ExampleError(
      `port ${port} on 127.0.0.1 is in use: set PORT to a free port (PORT=0 picks one)`,
      { cause: err },
    );
  }
}

if (import.meta.main) {
  exitOnMistakes("deploy");
  const onDeploy = Deno.env.get("DENO_DEPLOYMENT_ID") !== undefined;
  // Checked before anything is opened, so that a mistake leaves no KV file behind.
  const port = onDeploy ? undefined : localPort();
  // Under OTEL_DENO=true Deno's own provider is global already and exports over OTLP.
  const metrics = PrometheusMetrics.install();
  const kv = port === undefined
    ? await Deno.openKv()
    : await openKvFile(Deno.env.get("IDALLOC_KV_PATH") ?? "./deploy.kv", "IDALLOC_KV_PATH");
  const service = await IdentityService.open(kv, { node: isolateNode() });
  const stopping = new AbortController();
  const handler = createHandler(service, { signal: stopping.signal, metrics });
  let server: Deno.HttpServer<Deno.NetAddr>;
  try {
    server = port === undefined ? Deno.serve(handler) : serveLocally(port, handler, service.node);
  } catch (err) {
    // Nothing serves: let go of the store before saying why.
    await service.close();
    await metrics?.[Symbol.asyncDispose]();
    kv.close();
    throw err;
  }

  const listeners: Array<() => void> = [];
  const shutdown = async () => {
    if (stopping.signal.aborted) return;
    stopping.abort();
    for (const remove of listeners) remove();
    await server.shutdown();
    await service.close();
    await metrics?.[Symbol.asyncDispose]();
    kv.close();
    console.log("stopped");
  };
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    try {
      const listener = () => void shutdown();
      Deno.addSignalListener(signal, listener);
      listeners.push(() => Deno.removeSignalListener(signal, listener));
    } catch {
      // Not available here (Deploy manages the isolate's lifetime).
    }
  }
  await server.finished;
}
