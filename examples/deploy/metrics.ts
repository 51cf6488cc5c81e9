/**
 * `GET /metrics` for people who scrape: idalloc's OpenTelemetry metrics (and anything else the
 * isolate records through `@opentelemetry/api`) in Prometheus' text format, from
 * `@opentelemetry/exporter-prometheus` used as a reader and serializer only — it starts no server
 * of its own; the service's `Deno.serve` answers the request.
 *
 * Run with `OTEL_DENO=true` instead and Deno exports the same metrics (and the traces) over OTLP
 * itself; then Deno's provider is the global one and this endpoint is not installed.
 *
 * @example Serve the metrics next to the API
 * ```ts ignore
 * const metrics = PrometheusMetrics.install();
 * Deno.serve(createHandler(service, { metrics }));
 * ```
 *
 * @module
 */
import { metrics } from "@opentelemetry/api";
import { PrometheusExporter, PrometheusSerializer } from "@opentelemetry/exporter-prometheus";
import { MeterProvider } from "@opentelemetry/sdk-metrics";
import {
  defaultResource,
  detectResources,
  envDetector,
  type Resource,
  resourceFromAttributes,
} from "@opentelemetry/resources";

/**
 * The service name when the environment names none. Without one, OpenTelemetry's default is
 * `unknown_service:<path of the deno binary>`, which is what every scrape showed as `service_name`.
 */
export const DEFAULT_SERVICE_NAME = "idalloc-identity-service";

/**
 * The resource the metrics describe: OpenTelemetry's defaults (SDK name and version), then
 * {@linkcode DEFAULT_SERVICE_NAME}, then what the environment says (`OTEL_SERVICE_NAME`,
 * `OTEL_RESOURCE_ATTRIBUTES`), which wins. Without env access the environment says nothing.
 */
function serviceResource(): Resource {
  const base = defaultResource().merge(
    resourceFromAttributes({ "service.name": DEFAULT_SERVICE_NAME }),
  );
  try {
    return base.merge(detectResources({ detectors: [envDetector] }));
  } catch {
    return base;
  }
}

/** A global meter provider whose only reader renders Prometheus text on demand. */
export class PrometheusMetrics implements AsyncDisposable {
  readonly #exporter: PrometheusExporter;
  readonly #provider: MeterProvider;
  readonly #serializer = new PrometheusSerializer();

  private constructor(exporter: PrometheusExporter, provider: MeterProvider) {
    this.#exporter = exporter;
    this.#provider = provider;
  }

  /**
   * Installs a meter provider with a Prometheus reader as the global one. Returns `undefined` when
   * another global provider is installed already (Deno's own under `OTEL_DENO=true`).
   */
  static install(): PrometheusMetrics | undefined {
    const exporter = new PrometheusExporter({ preventServerStart: true });
    const provider = new MeterProvider({ readers: [exporter], resource: serviceResource() });
    if (!metrics.setGlobalMeterProvider(provider)) {
      void provider.shutdown();
      return undefined;
    }
    return new PrometheusMetrics(exporter, provider);
  }

  /** The metrics now, in Prometheus' text exposition format. */
  async text(): Promise<string> {
    const { resourceMetrics, errors } = await this.#exporter.collect();
    for (const err of errors) console.error("metric collection:", err);
    return this.#serializer.serialize(resourceMetrics);
  }

  /** Uninstalls the global provider and shuts it down. */
  async [Symbol.asyncDispose](): Promise<void> {
    metrics.disable();
    await this.#provider.shutdown();
  }
}
