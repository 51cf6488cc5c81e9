/**
 * What a backend reports about its store: every round trip (counted by operation and outcome,
 * timed, and — inside an allocator's span — traced as a child span), retries inside one
 * operation, group-commit batch sizes, lease renewals, and the watch's re-lists and reconnects.
 *
 * One {@linkcode StoreTelemetry} per backend: its attributes (backend kind, namespace, node) are
 * computed once and every derived attribute set is cached, so recording allocates nothing.
 *
 * @example Timing one round trip
 * ```ts
 * import assert from "node:assert/strict";
 * import { StoreTelemetry } from "./store.ts";
 * const telemetry = new StoreTelemetry("deno-kv", "idalloc/demo", "node-a");
 * const value = await telemetry.round("read", undefined, () => Promise.resolve(42));
 * assert.equal(value, 42);
 * ```
 *
 * @module
 */
import type { Attributes, Span } from "../deps/opentelemetry_api.ts";
import { ATTR } from "./catalog.ts";
import {
  AttributeSets,
  endSpan,
  errorType,
  instruments,
  parentRecording,
  tracer,
} from "./instruments.ts";

/** Outcome of one store round trip. */
export type RoundTripOutcome = "ok" | "check_failed" | "cancelled" | "error";

/** One round trip under way; end it exactly once. */
export class RoundTrip {
  readonly #telemetry: StoreTelemetry;
  readonly #operation: string;
  readonly #span: Span | undefined;
  readonly #started = performance.now();

  /** @param telemetry where to record @param operation what it is */
  constructor(telemetry: StoreTelemetry, operation: string) {
    this.#telemetry = telemetry;
    this.#operation = operation;
    // Only inside an allocator's span: background round trips (polls, renewals) stay untraced.
    this.#span = parentRecording()
      ? tracer().startSpan(`${telemetry.backend} ${operation}`, {
        attributes: telemetry.attributes(operation),
      })
      : undefined;
  }

  /**
   * Records the round trip. `seconds` overrides the elapsed time (a paged list counts only its
   * time waiting on the store).
   */
  end(outcome: RoundTripOutcome, err?: unknown, seconds?: number): void {
    const elapsed = seconds ?? (performance.now() - this.#started) / 1000;
    this.#telemetry.record(this.#operation, outcome, err, elapsed);
    if (this.#span) endSpan(this.#span, outcome, outcome === "error" ? err : undefined);
  }
}

/** The store-side telemetry of one backend. */
export class StoreTelemetry {
  /** Backend kind (`deno-kv`, `etcd`, `k8s`). */
  readonly backend: string;
  readonly #sets: AttributeSets;

  /**
   * @param backend the backend kind
   * @param prefix the namespace as an operator writes it
   * @param node the node name
   */
  constructor(backend: string, prefix: string, node: string) {
    this.backend = backend;
    this.#sets = new AttributeSets({
      [ATTR.backend]: backend,
      [ATTR.prefix]: prefix,
      [ATTR.node]: node,
    });
  }

  /** The attributes of `operation`. */
  attributes(operation: string): Attributes {
    return this.#sets.get(`op\0${operation}`, () => ({ [ATTR.operation]: operation }));
  }

  /** Starts timing one round trip of `operation`. */
  begin(operation: string): RoundTrip {
    return new RoundTrip(this, operation);
  }

  /**
   * Runs one round trip: `check_failed` when it resolves to a refused guarded write (`ok: false`,
   * or `succeeded: false`), `cancelled` when `signal` aborted, `error` when it threw.
   */
  async round<T>(
    operation: string,
    signal: AbortSignal | undefined,
    fn: () => Promise<T>,
  ): Promise<T> {
    const trip = this.begin(operation);
    let result: T;
    try {
      result = await fn();
    } catch (err) {
      trip.end(signal?.aborted ? "cancelled" : "error", err);
      throw err;
    }
    trip.end(refused(result) ? "check_failed" : "ok");
    return result;
  }

  /** Records a finished round trip (see {@linkcode RoundTrip.end}). */
  record(operation: string, outcome: RoundTripOutcome, err: unknown, seconds: number): void {
    const type = outcome === "error" ? errorType(err) : "";
    const counted = this.#sets.get(`r\0${operation}\0${outcome}\0${type}`, () => ({
      [ATTR.operation]: operation,
      [ATTR.outcome]: outcome,
      ...(type ? { [ATTR.errorType]: type } : {}),
    }));
    const timed = this.#sets.get(`t\0${operation}\0${outcome}`, () => ({
      [ATTR.operation]: operation,
      [ATTR.outcome]: outcome,
    }));
    const inst = instruments();
    inst.storeOperations.add(1, counted);
    inst.storeDuration.record(seconds, timed);
  }

  /** One request of `operation` failed with `err` and is tried again within the operation. */
  retry(operation: string, err: unknown): void {
    const type = errorType(err);
    instruments().storeRetries.add(
      1,
      this.#sets.get(`x\0${operation}\0${type}`, () => ({
        [ATTR.operation]: operation,
        [ATTR.errorType]: type,
      })),
    );
  }

  /** One store request of `operation` carried `size` operations (group commit). */
  batch(operation: string, size: number): void {
    instruments().batchSize.record(size, this.attributes(operation));
  }

  /** A lease renewal was confirmed (`err` undefined) or failed. */
  renewal(err?: unknown): void {
    const type = err === undefined ? "" : errorType(err);
    instruments().renewals.add(
      1,
      this.#sets.get(
        `l\0${type}`,
        () =>
          type ? { [ATTR.outcome]: "failed", [ATTR.errorType]: type } : { [ATTR.outcome]: "ok" },
      ),
    );
  }

  /** The watch listed every master, for `reason`. */
  relist(reason: string): void {
    instruments().relists.add(1, this.#sets.get(`w\0${reason}`, () => ({ [ATTR.reason]: reason })));
  }

  /** The watch failed with `err` and resumes. */
  reconnect(err: unknown): void {
    const type = errorType(err);
    instruments().reconnects.add(
      1,
      this.#sets.get(`c\0${type}`, () => ({ [ATTR.errorType]: type })),
    );
  }
}

/** Whether a store answer is a guarded write the store refused (a lost race, not a failure). */
function refused(result: unknown): boolean {
  if (typeof result !== "object" || result === null) return false;
  const r = result as { ok?: unknown; succeeded?: unknown };
  return r.ok === false || r.succeeded === false;
}
