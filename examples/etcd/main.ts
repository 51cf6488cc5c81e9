/**
 * `deno task etcd`: the cluster scenario (four node processes agree on IDs, one is killed, GC
 * reclaims) on etcd, in Cilium's key layout. Uses `ETCD_ENDPOINTS` (comma-separated client URLs,
 * or etcdctl's `host:port`) if set, else starts a private etcd on loopback when an `etcd` binary is
 * installed, else explains and exits 0. On an etcd of the user's, it removes what it wrote when it
 * is done (or says where it left it). An etcd that refuses access (authentication on: this example
 * connects without a user) is one line and exit 1, at once. Ctrl-C (or SIGTERM) stops the node
 * processes, cleans up as a finished run does (and stops a private etcd), then exits 130.
 *
 * @module
 */
import { Allocator, InvalidOptionsError } from "@idalloc/idalloc";
import { EtcdBackend, StoreAccessDeniedError } from "@idalloc/idalloc/etcd";
import { loadHarness, type PrivateServer } from "../../src/testing/harness.ts";
import { type ClusterStore, runCluster } from "../cluster/scenario.ts";
import { exitIfInterrupted, onInterrupt } from "../interrupt.ts";
import { ExampleError, exitOnMistakes } from "../mistakes.ts";

exitOnMistakes("etcd");
const interrupted = onInterrupt("etcd");
let etcd: PrivateServer | undefined;
let endpoints = Deno.env.get("ETCD_ENDPOINTS")?.split(",").map((e) => e.trim()).filter(Boolean);
if (endpoints === undefined || endpoints.length === 0) {
  // The repository's etcd harness starts a private etcd where one is installed.
  etcd = await (await loadHarness("etcd")).server?.();
  if (etcd === undefined) {
    console.log(
      "skipped: no etcd. Set ETCD_ENDPOINTS=http://127.0.0.1:2379 or install one " +
        "(Debian/Ubuntu: apt-get install etcd-server) and run `deno task etcd` again.",
    );
    Deno.exit(0);
  }
  endpoints = [...etcd.endpoints];
  console.log(`started a private etcd at ${endpoints.join(", ")}`);
} else {
  console.log(`using etcd at ${endpoints.join(", ")} (ETCD_ENDPOINTS)`);
}

// A fresh prefix per run, so that a shared etcd keeps runs apart.
const prefix = `idalloc-example/${crypto.randomUUID().slice(0, 8)}`;
let ok = false;
try {
  await using operator = await connect(endpoints, prefix);
  console.log(`Cilium's layout under ${prefix}: id/<ID> → key, value/<key>/<node> → ID (leased)\n`);
  try {
    ok = await runCluster(
      { kind: "etcd", endpoints, prefix } satisfies ClusterStore,
      operator,
      interrupted,
    );
  } catch (err) {
    // What fails once the run is interrupted is the interruption's doing.
    if (!interrupted.aborted) throw err;
  } finally {
    // A private etcd goes away with its data; the user's keeps what the example wrote unless it
    // is removed here.
    if (etcd === undefined) await cleanUp(operator);
  }
} finally {
  await etcd?.close();
}
exitIfInterrupted(interrupted);
if (!ok) Deno.exit(1);

/** The operator's backend; a mistake in `ETCD_ENDPOINTS` is said as one. */
async function connect(endpoints: string[], prefix: string): Promise<EtcdBackend> {
  try {
    return await EtcdBackend.connect({ endpoints, prefix, node: "operator" });
  } catch (err) {
    if (err instanceof StoreAccessDeniedError) {
      throw new ExampleError(
        `${err.message}; this example connects without a user: point ETCD_ENDPOINTS at an etcd ` +
          "without authentication, or leave it unset for a private etcd",
        { cause: err },
      );
    }
    if (!(err instanceof InvalidOptionsError)) throw err;
    throw new ExampleError(
      `ETCD_ENDPOINTS takes comma-separated client URLs (http://127.0.0.1:2379) or host:port: ` +
        err.message,
      { cause: err },
    );
  }
}

/**
 * Removes what the run wrote: the nodes released their keys when they stopped and the killed
 * node's references lapsed with its lease, so two GC passes delete every master left under the
 * prefix. Says where anything is left.
 */
async function cleanUp(operator: EtcdBackend): Promise<void> {
  const signal = AbortSignal.timeout(10_000);
  let left = true;
  try {
    // Nothing runs under the prefix any more: no grace, two back-to-back passes collect it all.
    await using gc = await Allocator.open(operator, { min: 256, max: 65535, gcGraceMs: 0 }, {
      signal,
    });
    let deleted = 0;
    for (let pass = 0; pass < 2; pass++) deleted += (await gc.runGc({ signal })).deleted;
    left = await operator.admin().namespaceExists(signal);
    if (!left) console.log(`removed the example's ${deleted} IDs from etcd (${prefix} is empty)`);
  } catch (err) {
    console.error(`cleaning up failed: ${err instanceof Error ? err.message : err}`);
  }
  if (left) {
    console.log(`left entries under ${prefix}/ in etcd: etcdctl del --prefix ${prefix}/`);
  }
}
