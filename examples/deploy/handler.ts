/**
 * The HTTP API of the Deploy example, as a plain `(Request) => Promise<Response>`:
 *
 * | Method and path | Answer |
 * |---|---|
 * | `POST /v1/identities` `{"labels": ["k8s:app=web", …]}` | `201` (created) or `200` `{id, labels, isNew}` |
 * | `GET /v1/identities/:id` | `200` `{id, labels}` or `404` |
 * | `DELETE /v1/identities/:id` | `200` `{id, labels, released: true}` or `404` |
 * | `GET /v1/identities` | `200` `{identities: [{id, labels}]}`: what the service claims |
 * | `GET /v1/identities?watch` | Server-Sent Events: `added`, `deleted`, `synced` |
 * | `GET /v1/status` | `200` this isolate's node, references held, store health |
 * | `GET /metrics` | Prometheus text: idalloc's metrics (with `HandlerOptions.metrics`) |
 *
 * Input is validated (zod); every error is JSON `{"error": {"code", "message"}}` with a 4xx
 * status for the client's mistakes and 503 (with `Retry-After`) when the store is unavailable.
 *
 * @module
 */
import { z } from "zod";
import { type Identity, type IdentityChange, Labels } from "@idalloc/idalloc/identity";
import { type IdentityService, NodeLocalLabelsError } from "./service.ts";

/** Options of {@linkcode createHandler}. */
export interface HandlerOptions {
  /** Ends every open event stream (for a graceful shutdown). */
  readonly signal?: AbortSignal;
  /** Interval of the keep-alive comment on event streams, in ms. @default {15000} */
  readonly heartbeatMs?: number;
  /** Serves `GET /metrics` in Prometheus' text format (see `metrics.ts`); 404 without it. */
  readonly metrics?: { text(): Promise<string> };
}

/** Largest request body accepted, in bytes. */
const MAX_BODY_BYTES = 64 * 1024;

// The shape only: what makes a label valid is `Labels.parse`'s to say (the library's one label
// parser, which the CLI uses too), so that every bad label gets the same verdict everywhere.
const createSchema = z.object({
  labels: z.array(z.string().max(1024)).min(1).max(256),
}).strict();

/** An identity ID in a path: a positive whole number; the message names what was sent. */
function parseId(text: string): number {
  const n = /^[0-9]{1,16}$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(n) || n <= 0) {
    throw new HttpError(
      400,
      "invalid_id",
      `an identity ID is a positive whole number, got ${JSON.stringify(text)}`,
    );
  }
  return n;
}

/** An error answer. */
class HttpError extends Error {
  readonly status: number;
  readonly code: string;
  readonly headers: Record<string, string>;
  constructor(status: number, code: string, message: string, headers: Record<string, string> = {}) {
    super(message);
    this.name = "HttpError";
    this.status = status;
    this.code = code;
    this.headers = headers;
  }
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json; charset=utf-8", ...headers },
  });
}

function present(identity: Identity): { id: number; labels: string[] } {
  return { id: identity.id, labels: identity.labels.toJSON() };
}

async function readJson(req: Request): Promise<unknown> {
  const type = req.headers.get("content-type") ?? "";
  if (!/^application\/json\b/i.test(type)) {
    throw new HttpError(415, "unsupported_media_type", "send the body as application/json");
  }
  const declared = Number(req.headers.get("content-length") ?? "0");
  if (declared > MAX_BODY_BYTES) {
    throw new HttpError(413, "body_too_large", `the body is limited to ${MAX_BODY_BYTES} bytes`);
  }
  // Read with a cap: a chunked body has no content-length to trust.
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of req.body ?? new ReadableStream<Uint8Array>()) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) {
      throw new HttpError(413, "body_too_large", `the body is limited to ${MAX_BODY_BYTES} bytes`);
    }
    chunks.push(chunk);
  }
  const bytes = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    bytes.set(chunk, offset);
    offset += chunk.length;
  }
  const text = new TextDecoder().decode(bytes);
  try {
    return JSON.parse(text);
  } catch {
    throw new HttpError(400, "invalid_json", "the body is not valid JSON");
  }
}

function parse<T>(schema: z.ZodType<T>, input: unknown, code: string): T {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const message = parsed.error.issues
    .map((i) => `${i.path.length ? i.path.join(".") : "the body"}: ${i.message}`)
    .join("; ");
  throw new HttpError(400, code, message);
}

function toHttpError(err: unknown): HttpError {
  if (err instanceof HttpError) return err;
  if (err instanceof NodeLocalLabelsError) {
    return new HttpError(422, "node_local_labels", err.message);
  }
  const name = err instanceof Error ? err.name : "";
  const message = err instanceof Error ? err.message : String(err);
  switch (name) {
    case "LabelError":
    case "InvalidKeyError":
      return new HttpError(400, "invalid_labels", message);
    case "InvalidIdError":
      return new HttpError(400, "invalid_id", message);
    case "StoreUnavailableError":
    case "AllocationFailedError":
    case "PoolExhaustedError":
    case "ConflictError":
    case "ClosedError":
      return new HttpError(503, "unavailable", message, { "retry-after": "1" });
    default:
      console.error("unexpected error", err);
      return new HttpError(500, "internal", "internal error");
  }
}

function eventStream(service: IdentityService, options: HandlerOptions): Response {
  // The stream ends when the client goes away (cancel) or the server shuts down. `request.signal`
  // is not used: under Deno.serve it also aborts after every successful response.
  const stop = new AbortController();
  const signal = options.signal ? AbortSignal.any([stop.signal, options.signal]) : stop.signal;
  const encoder = new TextEncoder();
  let heartbeat: ReturnType<typeof setInterval> | undefined;
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      const send = (event: string, data: unknown) =>
        controller.enqueue(encoder.encode(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`));
      heartbeat = setInterval(
        () => controller.enqueue(encoder.encode(": keep-alive\n\n")),
        options.heartbeatMs ?? 15_000,
      );
      // Subscribe, then take the snapshot in the same synchronous step: no change falls between.
      const changes = service.changes(signal);
      for (const identity of service.snapshot()) send("added", present(identity));
      send("synced", {});
      void (async () => {
        try {
          for await (const batch of changes as AsyncIterable<IdentityChange>) {
            for (const [id, labels] of batch.added) send("added", { id, labels: labels.toJSON() });
            for (const id of batch.deleted) send("deleted", { id });
          }
        } catch {
          // The client went away while a batch was being sent.
        } finally {
          clearInterval(heartbeat);
          try {
            controller.close();
          } catch {
            // already closed or cancelled
          }
        }
      })();
    },
    cancel() {
      clearInterval(heartbeat);
      stop.abort();
    },
  });
  return new Response(body, {
    headers: {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      "x-accel-buffering": "no",
    },
  });
}

/**
 * The request handler of the identity service; serve it with `Deno.serve(createHandler(service))`
 * (or `export default { fetch: createHandler(service) }` under `deno serve`).
 */
export function createHandler(
  service: IdentityService,
  options: HandlerOptions = {},
): (req: Request) => Promise<Response> {
  // Calls end early only when the server shuts down, never because one client went away: a
  // half-done create would leave a reference without its claim until the next reconcile.
  const signal = options.signal ?? new AbortController().signal;
  return async (req: Request): Promise<Response> => {
    const url = new URL(req.url);
    const path = url.pathname.replace(/\/+$/, "");
    try {
      if (path === "/v1/identities") {
        if (req.method === "POST") {
          const { labels } = parse(createSchema, await readJson(req), "invalid_request");
          const { identity, isNew } = await service.create(Labels.parse(labels), signal);
          return json(isNew ? 201 : 200, { ...present(identity), isNew }, {
            location: `/v1/identities/${identity.id}`,
          });
        }
        if (req.method === "GET") {
          if (url.searchParams.has("watch")) return eventStream(service, options);
          return json(200, { identities: (await service.list()).map(present) });
        }
        throw new HttpError(405, "method_not_allowed", `${req.method} is not allowed here`, {
          allow: "GET, POST",
        });
      }
      const match = /^\/v1\/identities\/([^/]+)$/.exec(path);
      if (match) {
        const id = parseId(decodeURIComponent(match[1]));
        if (req.method === "GET") {
          const identity = await service.get(id, signal);
          if (!identity) throw new HttpError(404, "not_found", `identity ${id} does not exist`);
          return json(200, present(identity));
        }
        if (req.method === "DELETE") {
          const identity = await service.remove(id, signal);
          if (!identity) {
            throw new HttpError(404, "not_found", `identity ${id} is not claimed by this service`);
          }
          return json(200, { ...present(identity), released: true });
        }
        throw new HttpError(405, "method_not_allowed", `${req.method} is not allowed here`, {
          allow: "GET, DELETE",
        });
      }
      if (path === "/metrics" && options.metrics) {
        if (req.method !== "GET") {
          throw new HttpError(405, "method_not_allowed", `${req.method} is not allowed here`, {
            allow: "GET",
          });
        }
        return new Response(await options.metrics.text(), {
          headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
        });
      }
      if (path === "/v1/status") {
        if (req.method !== "GET") {
          throw new HttpError(405, "method_not_allowed", `${req.method} is not allowed here`, {
            allow: "GET",
          });
        }
        const session = service.identities;
        return json(200, { ...service.status(), remotes: session.remotes() });
      }
      throw new HttpError(404, "not_found", `no route for ${req.method} ${url.pathname}`);
    } catch (err) {
      const error = toHttpError(err);
      return json(
        error.status,
        { error: { code: error.code, message: error.message } },
        error.headers,
      );
    }
  };
}
