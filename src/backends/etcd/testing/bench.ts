/**
 * etcd's bench opener: a fresh private etcd per measurement, a node's backend on it, the raw
 * ceiling (one create-if-absent transaction per key on one client), and the cells only etcd has
 * (new keys without the Cilium-mutex guard).
 *
 * @module
 */
import type { Backend } from "../../../allocator/backend.ts";
import type { BenchCell, BenchHooks, RawWriter } from "../../../testing/bench.ts";
import { EtcdBackend } from "../mod.ts";
import { startEtcd } from "./cluster.ts";
import { b, rawClient } from "./fixture.ts";

/** The endpoints a measurement's children connect to. */
function endpoints(where: unknown): string[] {
  if (!Array.isArray(where) || !where.every((e) => typeof e === "string")) {
    throw new TypeError("an etcd bench store is a list of endpoints");
  }
  return [...where];
}

async function open(
  where: unknown,
  prefix: string,
  node: string,
  options?: Record<string, unknown>,
): Promise<Backend & AsyncDisposable> {
  return await EtcdBackend.connect({ endpoints: endpoints(where), prefix, node, ...options });
}

function raw(where: unknown): Promise<RawWriter> {
  const client = rawClient(endpoints(where));
  return Promise.resolve({
    async write(i: number, key: string): Promise<void> {
      const stored = b(`bench/raw/${i}`);
      await client.kv.txn({
        compare: [{ key: stored, target: "Version", result: "Equal", version: 0 }],
        success: [{ request_put: { key: stored, value: b(key) } }],
      });
    },
    [Symbol.asyncDispose]: () => Promise.resolve(client.close()),
  });
}

/** New keys without the Cilium-mutex guard (`honorCiliumLocks: false`), to show what it costs. */
function withoutGuard(sizes: { sequential: number; parallel: number }): BenchCell[] {
  return [
    {
      name: "new keys, sequential, no Cilium-mutex guard",
      scenario: "new",
      count: sizes.sequential,
      width: 1,
      options: { honorCiliumLocks: false },
      versus: "raw, sequential",
    },
    {
      name: "new keys, 16 in flight, no Cilium-mutex guard",
      scenario: "new",
      count: sizes.parallel,
      width: 16,
      options: { honorCiliumLocks: false },
      versus: "raw, 16 in flight",
    },
  ];
}

/** etcd's bench hooks. */
export const etcdBench: BenchHooks = {
  extraCells: withoutGuard,
  async fresh() {
    const etcd = await startEtcd();
    return { where: [...etcd.endpoints], [Symbol.asyncDispose]: () => etcd.close() };
  },
  open,
  raw,
  ciliumPeer: (where) => endpoints(where)[0],
  example: {
    async start() {
      const etcd = await startEtcd();
      return {
        args: [],
        env: { ETCD_ENDPOINTS: etcd.endpoints.join(",") },
        [Symbol.asyncDispose]: () => etcd.close(),
      };
    },
  },
};
