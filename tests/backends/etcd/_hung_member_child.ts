/**
 * Child of `hung_member.test.ts` (grpc-js keeps its handshake timers for a peer that never speaks
 * a while after `close()`, so this runs in its own process): connects with `endpoints` (a silent
 * one among them) and reads master `id` `reads` times, each within `requestTimeoutMs`. Prints
 * `ok`, or the first failure, and exits.
 *
 * `deno run -A _hung_member_child.ts '<JSON {endpoints, prefix, id, reads, requestTimeoutMs}>'`
 */
import { EtcdBackend } from "../../../src/backends/etcd/mod.ts";

const { endpoints, prefix, id, reads, requestTimeoutMs } = JSON.parse(Deno.args[0]);
try {
  const backend = await EtcdBackend.connect({
    endpoints,
    prefix,
    node: "reader",
    requestTimeoutMs,
  });
  const session = await backend.openSession({
    leaseTtlMs: 5_000,
    readOnly: true,
    onLeaseReplaced: () => {},
  });
  for (let i = 0; i < reads; i++) await session.getById(id, AbortSignal.timeout(30_000));
  console.log("ok");
} catch (err) {
  console.log(`failed: ${err}`);
}
Deno.exit(0);
