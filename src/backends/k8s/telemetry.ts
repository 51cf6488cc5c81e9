/**
 * The Kubernetes backend's round trips, timed through {@linkcode StoreTelemetry} like the other
 * backends': every request of the API client is one round trip named `<verb> <plural>` (`create
 * ciliumidentities`, `patch ciliumidentities`, `list leases`…), counted by outcome — `ok`,
 * `check_failed` for a guarded write the API server refused (409: the name is taken, or the
 * resource version changed: a lost race, not a failure), `cancelled`, or `error` with the error's
 * class — timed, and traced as a child span inside an allocator's span. A watch counts once, when
 * it opens.
 *
 * @example
 * ```ts ignore
 * // ignored: needs an API server (tests/backends/k8s/telemetry.test.ts runs it).
 * const client = timedClient(await createKubeClient(connection), new StoreTelemetry("k8s", "ciliumidentities.cilium.io/v2", "node-a"));
 * await client.list(identities); // one "list ciliumidentities" round trip
 * ```
 *
 * @module
 */
import type { StoreTelemetry } from "../../telemetry/store.ts";
import type { CallOptions, KubeClient, KubeResourceDescriptor } from "./client.ts";
import { isStatus } from "./kube.ts";

/**
 * `client` with every request timed through `telemetry` (see the module doc). Closing the result
 * closes `client`.
 */
export function timedClient(client: KubeClient, telemetry: StoreTelemetry): KubeClient {
  const timed = <T>(
    verb: string,
    res: KubeResourceDescriptor | undefined,
    options: CallOptions | undefined,
    call: () => Promise<T>,
  ): Promise<T> => {
    const trip = telemetry.begin(res === undefined ? verb : `${verb} ${res.plural}`);
    return call().then(
      (value) => {
        trip.end("ok");
        return value;
      },
      (err: unknown) => {
        trip.end(
          options?.signal?.aborted ? "cancelled" : isStatus(err, 409) ? "check_failed" : "error",
          err,
        );
        throw err;
      },
    );
  };
  return {
    server: client.server,
    namespace: client.namespace,
    source: client.source,
    get: (res, name, o) => timed("get", res, o, () => client.get(res, name, o)),
    list: (res, o) => timed("list", res, o, () => client.list(res, o)),
    create: (res, obj, o) => timed("create", res, o, () => client.create(res, obj, o)),
    update: (res, obj, o) => timed("update", res, o, () => client.update(res, obj, o)),
    patch: (res, name, body, o) => timed("patch", res, o, () => client.patch(res, name, body, o)),
    delete: (res, name, o) => timed("delete", res, o, () => client.delete(res, name, o)),
    watch: (res, o) => {
      // The stream's events are not round trips; opening it is counted, as etcd's watch is.
      telemetry.begin(`watch ${res.plural}`).end("ok");
      return client.watch(res, o);
    },
    version: (o) => timed("version", undefined, o, () => client.version(o)),
    probe: (targets, o) => timed("probe", undefined, o, () => client.probe(targets, o)),
    close: () => client.close(),
    [Symbol.asyncDispose]: () => client.close(),
  } as KubeClient;
}
