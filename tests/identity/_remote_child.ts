/**
 * The README's identity snippet ("Security identities"), with both backends on one in-memory
 * Deno KV and a signal far longer than the work: prints `done` once its work is done and
 * everything is closed. The process should then exit at once (`remote_exit.test.ts`).
 *
 * `deno run -A tests/identity/_remote_child.ts <signal ms>`
 */
import { DenoKvBackend } from "../../mod.ts";
import { IdentityAllocator, Labels } from "../../src/identity/mod.ts";

using kv = await Deno.openKv(":memory:");
const backend = new DenoKvBackend(kv, { prefix: ["cluster-1"], node: "10.0.1.1" });
const remoteBackend = new DenoKvBackend(kv, { prefix: ["cluster-2"], node: "10.0.2.1" });
const signal = AbortSignal.timeout(Number(Deno.args[0]));
{
  await using identities = await IdentityAllocator.open(backend, { clusterId: 0 });
  const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
  const { identity } = await identities.allocate(labels);
  identities.lookup(labels);
  identities.lookupById(identity.id);
  // The snippet's `changes()` loop is left out: it runs until its signal by design.
  await identities.watchRemote("cluster-2", remoteBackend, { clusterId: 2, signal });
  await identities.release(identity);
}
console.log("done");
