/**
 * The Kubernetes nemesis harness's own calls, kept alive through the faults it injects. The run's
 * API server is restarted and its etcd killed many times a run, and a call of the harness (a
 * snapshot of the store, a garbage plant, a Lease revocation, a fault's own read) that meets such
 * an outage must not fail the harness: that is the system under test's weather, not the
 * harness's. So each harness call is retried while its failure is retryable (a refused
 * connection, a timeout, `429`, `5xx`: `IdallocError.retryable`), for up to a bound
 * ({@linkcode HARNESS_RETRY_MS}) after which it fails with {@linkcode HarnessRetryError}. A store
 * that does not come back within it is a broken run, and says so.
 *
 * Only the harness goes through here: the workers, the GC loop and Cilium's nodes meet the
 * outages as they are (that is what the run measures), and the store's record and the endpoint
 * writer keep retrying on their own (`nemesis_cilium.ts`).
 *
 * @example A call that fails for good is not retried
 * ```ts
 * import assert from "node:assert/strict";
 * import { untilServed } from "./nemesis_retry.ts";
 * let calls = 0;
 * await assert.rejects(untilServed("read", () => Promise.reject(new TypeError(`${++calls}`))));
 * assert.equal(calls, 1);
 * ```
 *
 * @module
 */
import { sleep } from "../../../abort.ts";
import { IdallocError, StoreTlsError } from "../../../errors.ts";
import type { KubeClient } from "../client.ts";

/**
 * How long the run's kube-apiserver may take to turn ready after a start or restart. The
 * launcher's 60 s was too little on a 2-core machine at load 50–60 (seed 3 of the second mixed
 * runs): each start was killed as not ready after 60 s and started again, never ready.
 */
export const API_SERVER_READY_MS = 180_000;

/**
 * How long a harness call is retried: an API-server restart that takes its whole readiness bound,
 * and an etcd restart that overlaps it.
 */
export const HARNESS_RETRY_MS = API_SERVER_READY_MS + 120_000;

/** Pause between two attempts. */
const RETRY_PAUSE_MS = 500;

/** A harness call that still failed with a retryable error after its bound; `cause`: the last. */
export class HarnessRetryError extends Error {
  override readonly name = "HarnessRetryError";
  /** What was being done. */
  readonly what: string;
  /** Attempts made. */
  readonly attempts: number;

  /**
   * @param what what was being done
   * @param attempts attempts made
   * @param withinMs the bound that passed
   * @param cause the last attempt's failure
   */
  constructor(what: string, attempts: number, withinMs: number, cause: unknown) {
    super(
      `${what}: still failing after ${attempts} attempts over ${withinMs} ms ` +
        `(the store did not come back): ${cause}`,
      { cause },
    );
    this.what = what;
    this.attempts = attempts;
  }
}

/**
 * Whether `err` may pass when the store is back: a refused connection, a timeout, 429, 5xx — and
 * `StoreTlsError` `not-tls`. A kube-apiserver that has bound its port but is still starting closes
 * connections before the TLS handshake, which the client reads as a plain-text server (measured:
 * "Client network socket disconnected before secure TLS connection was established" right after a
 * restart). For a run's own API server, whose TLS worked a moment before, that is the restart.
 */
export function retryable(err: unknown): boolean {
  if (err instanceof StoreTlsError) return err.problem === "not-tls";
  return err instanceof IdallocError && err.retryable;
}

/**
 * `call()`'s result, calling it again after each retryable failure until `withinMs` has passed
 * (then {@linkcode HarnessRetryError}); any other failure, or any once `signal` has aborted, is
 * thrown at once. `call` must be safe to repeat: a write whose answer was lost may have landed.
 */
export async function untilServed<T>(
  what: string,
  call: () => Promise<T>,
  withinMs: number = HARNESS_RETRY_MS,
  signal?: AbortSignal,
): Promise<T> {
  const deadline = Date.now() + withinMs;
  for (let attempt = 1;; attempt++) {
    try {
      return await call();
    } catch (err) {
      if (!retryable(err) || signal?.aborted) throw err;
      if (Date.now() + RETRY_PAUSE_MS > deadline) {
        throw new HarnessRetryError(what, attempt, withinMs, err);
      }
      await sleep(RETRY_PAUSE_MS);
    }
  }
}

/**
 * `client` with each call (`get`, `list`, `create`, `update`, `patch`, `delete`, `version`)
 * retried by {@linkcode untilServed}; `watch` and `close` as they are. For code that takes a
 * client (the garbage planter, a fault's own reads). Each attempt is bounded by the client's own
 * request deadline; a signal passed in the options bounds all of them (its abort is not retried).
 * A create retried after a lost answer may meet its own object (`409`), which the caller sees.
 */
export function retryingClient(
  client: KubeClient,
  withinMs: number = HARNESS_RETRY_MS,
): KubeClient {
  const retried = new Set(["get", "list", "create", "update", "patch", "delete", "version"]);
  return new Proxy(client, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof value !== "function") return value;
      if (typeof prop !== "string" || !retried.has(prop)) return value.bind(target);
      return (...args: unknown[]) =>
        untilServed(
          `${prop} ${describe(args[0])}`,
          () => value.apply(target, args),
          withinMs,
          signalOf(args),
        );
    },
  });
}

/** The signal among a call's options (its last object argument), if any. */
function signalOf(args: readonly unknown[]): AbortSignal | undefined {
  const options = args.at(-1) as { signal?: unknown } | null | undefined;
  return options?.signal instanceof AbortSignal ? options.signal : undefined;
}

/** A resource argument in words (`ciliumidentities`), for messages. */
function describe(res: unknown): string {
  const plural = (res as { plural?: unknown } | null)?.plural;
  return typeof plural === "string" ? plural : "the API server";
}
