/**
 * A keepalive answer is timed from its own request. etcd answers a lease's keepalives in order
 * on one stream and renews the lease when each request arrives, so the lease certainly lives until
 * the request's send time plus the TTL. When answers come late (a slow network, a loaded etcd, a
 * process that was stopped with answers in its socket), timing an answer from the *latest*
 * request instead claims up to one keepalive interval more than etcd granted: a node would keep
 * answering from memory after etcd deleted its references, while a Cilium node (which treats a key
 * without a live reference as free) may already have given the key a second ID.
 *
 * Here a loopback proxy delays every byte etcd sends by 2.5 s once the session's keepalive stream
 * is up (TTL 6 s, keepalives every 2 s), and the session's claim is sampled: it must never reach
 * further than the TTL less the delay. The flaw claims a whole interval (2 s) more; the test
 * allows half of one, and the lease keeps 1.5 s to spare between answers, so a loaded machine
 * whose timers run late by up to a second neither fails it nor lets the flaw pass.
 */
import assert from "node:assert/strict";
import { sleep } from "../../../src/abort.ts";
import { etcdTest, namespace, openSession } from "./_helpers.ts";

const DELAY_MS = 2_500;
const TTL_MS = 6_000;
/** Keepalives go out every TTL/3 (`lease.ts`). */
const INTERVAL_MS = TTL_MS / 3;

/** Forwards loopback connections to `target`, delaying what comes back by `delay.ms`. */
function delayingProxy(target: { hostname: string; port: number }, delay: { ms: number }) {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns = new Set<Deno.Conn>();
  const pumps = new Set<Promise<unknown>>();
  const pump = async (from: Deno.Conn, to: Deno.Conn, delayed: boolean) => {
    let chain = Promise.resolve();
    try {
      for await (const chunk of from.readable) {
        const due = Date.now() + (delayed ? delay.ms : 0);
        // Order is kept: each chunk waits for the one before it, then for its own due time.
        chain = chain.then(async () => {
          await sleep(Math.max(0, due - Date.now()));
          const writer = to.writable.getWriter();
          try {
            await writer.write(chunk);
          } finally {
            writer.releaseLock();
          }
        }).catch(() => {});
      }
    } catch {
      // A closed connection ends the pump.
    }
    await chain;
  };
  const serving = (async () => {
    for await (const client of listener) {
      const server = await Deno.connect(target);
      conns.add(client).add(server);
      const pumping = Promise.all([pump(client, server, false), pump(server, client, true)]);
      pumps.add(pumping);
      void pumping.finally(() => {
        pumps.delete(pumping);
        for (const c of [client, server]) {
          conns.delete(c);
          try {
            c.close();
          } catch { /* already closed */ }
        }
      });
    }
  })().catch(() => {});
  return {
    endpoint: `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`,
    async close() {
      listener.close();
      for (const c of conns) {
        try {
          c.close();
        } catch { /* already closed */ }
      }
      await serving;
      // Chunks still waiting out their delay finish (into closed connections) before the end.
      await Promise.allSettled([...pumps]);
    },
  };
}

etcdTest("a late keepalive answer never extends the claim past what etcd granted", async () => {
  await using ns = await namespace();
  const url = new URL(ns.endpoints[0]);
  const delay = { ms: 0 };
  const proxy = delayingProxy({ hostname: url.hostname, port: Number(url.port) }, delay);
  try {
    const { EtcdBackend } = await import("../../../src/backends/etcd/mod.ts");
    const backend = await EtcdBackend.connect({
      endpoints: [proxy.endpoint],
      prefix: ns.prefix,
      node: "delayed",
      requestTimeoutMs: 10_000,
    });
    try {
      await using session = await openSession(backend, { leaseTtlMs: TTL_MS });
      // The keepalive stream opens on the first renewal; answers are late from then on.
      await session.renew(AbortSignal.timeout(5_000));
      delay.ms = DELAY_MS;
      // Judged once the answers of requests sent after the switch arrive, for several rounds.
      await sleep(DELAY_MS + 200);
      let ahead = 0;
      let lowest = Infinity;
      const until = Date.now() + 2 * TTL_MS;
      while (Date.now() < until) {
        const left = session.claimValidUntil() - Date.now();
        ahead = Math.max(ahead, left);
        lowest = Math.min(lowest, left);
        await sleep(25);
      }
      // An answer arrives DELAY_MS after its request left: the claim can reach TTL − DELAY_MS
      // beyond now, never further. The slack (half an interval) covers a loaded machine's late
      // timers; timing answers from the latest request would overshoot by a whole interval.
      assert.ok(
        ahead <= TTL_MS - DELAY_MS + INTERVAL_MS / 2,
        `the claim reached ${ahead} ms ahead; etcd granted at most ${TTL_MS - DELAY_MS} ms`,
      );
      // And the lease stays alive all along: late answers still renew it.
      assert.ok(lowest > 0, `the claim ran out (${lowest} ms left at the lowest)`);
    } finally {
      await backend.close();
    }
  } finally {
    await proxy.close();
  }
});
