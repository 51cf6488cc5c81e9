/**
 * The Kubernetes API as the protocol uses it: the client's types (`./client.ts`), how an API
 * status is recognised, and a wrapper that counts the round trips of one operation
 * (`AcquireRequest.roundTrips`).
 *
 * @module
 */
import type { KubeClient, KubeObject } from "./client.ts";
import type { KubeApiError } from "./errors.ts";

export type {
  KubeClient,
  KubeList,
  KubeObject,
  KubeObjectMeta,
  KubeResourceDescriptor as KubeResource,
  KubeWatchEvent,
} from "./client.ts";

/**
 * The resource version of `obj` (`""` when it has none). Opaque: the API allows comparing two
 * only for equality, never for order.
 */
export function rvOf(obj: KubeObject): string {
  return String(obj.metadata?.resourceVersion ?? "");
}

/**
 * Whether `err` is an API status ({@linkcode KubeApiError}, told by its stable name) with `code`
 * (and `reason`, when given).
 */
export function isStatus(err: unknown, code: number, reason?: string): err is KubeApiError {
  const e = err as Partial<KubeApiError> | null;
  return typeof e === "object" && e !== null && e.name === "KubeApiError" && e.code === code &&
    (reason === undefined || e.reason === reason);
}

/**
 * `write`'s result, or `undefined` when the API server refused it with one of `codes`: the answers
 * by which a guarded write learns it lost (409: the resource version moved on; 404: the object is
 * gone; 422: a JSON patch's `test` failed). Any other failure is thrown.
 */
export async function unlessRefused<T>(
  write: Promise<T>,
  ...codes: readonly number[]
): Promise<T | undefined> {
  try {
    return await write;
  } catch (err) {
    if (codes.some((code) => isStatus(err, code))) return undefined;
    throw err;
  }
}

/** A round-trip counter (`AcquireRequest.roundTrips`). */
export interface Tally {
  /** Round trips so far. */
  count: number;
}

/**
 * `client`, with every request it sends (successful or not) counted in `tally`; a watch counts
 * once. Closing the result does not close `client`.
 */
export function countedClient(client: KubeClient, tally: Tally | undefined): KubeClient {
  if (tally === undefined) return client;
  const count = <T>(p: Promise<T>): Promise<T> => {
    tally.count++;
    return p;
  };
  return {
    server: client.server,
    namespace: client.namespace,
    source: client.source,
    get: (res, name, o) => count(client.get(res, name, o)),
    list: (res, o) => count(client.list(res, o)),
    create: (res, obj, o) => count(client.create(res, obj, o)),
    update: (res, obj, o) => count(client.update(res, obj, o)),
    patch: (res, name, body, o) => count(client.patch(res, name, body, o)),
    delete: (res, name, o) => count(client.delete(res, name, o)),
    watch: (res, o) => {
      tally.count++;
      return client.watch(res, o);
    },
    version: (o) => count(client.version(o)),
    probe: (targets, o) => count(client.probe(targets, o)),
    close: () => Promise.resolve(),
    [Symbol.asyncDispose]: () => Promise.resolve(),
  } as KubeClient;
}
