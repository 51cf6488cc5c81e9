/**
 * `deno task cluster`: four nodes as separate processes on one embedded Deno KV file agree on
 * IDs; one is killed; the operator's GC reclaims what only it used. Exits 1 if a check fails.
 * Ctrl-C (or SIGTERM) stops the node processes and removes the temporary directory, as a finished
 * run does, then exits 130.
 *
 * @module
 */
import { DenoKvBackend } from "@idalloc/idalloc";
import { exitIfInterrupted, onInterrupt } from "../interrupt.ts";
import { exitOnMistakes } from "../mistakes.ts";
import { type ClusterStore, runCluster } from "./scenario.ts";

exitOnMistakes("cluster");
const interrupted = onInterrupt("cluster");

const dir = await Deno.makeTempDir({ prefix: "idalloc-cluster-" });
const store: ClusterStore = { kind: "deno-kv", path: `${dir}/ids.kv`, prefix: ["cluster"] };
console.log(`Deno KV file ${store.path}\n`);
let ok = false;
try {
  using kv = await Deno.openKv(store.path);
  const operator = new DenoKvBackend(kv, {
    prefix: store.prefix,
    node: "operator",
    pollIntervalMs: 100,
    maxClockSkewMs: 300,
  });
  ok = await runCluster(store, operator, interrupted);
} catch (err) {
  // What fails once the run is interrupted is the interruption's doing.
  if (!interrupted.aborted) throw err;
} finally {
  await Deno.remove(dir, { recursive: true });
}
exitIfInterrupted(interrupted);
if (!ok) Deno.exit(1);
