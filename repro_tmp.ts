import { Allocator } from "./mod.ts";
import { EtcdBackend } from "./src/backends/etcd/mod.ts";
import { startEtcd } from "./tests/_support/etcd.ts";
await using etcd = await startEtcd();
await using backend = await EtcdBackend.connect({ endpoints: [...etcd.endpoints], prefix: "p", node: "a" });
for (let round = 0; round < 3; round++) {
  const t0 = performance.now();
  const a = await Allocator.open(backend, { max: 1000 });
  await a.waitForInitialSync();
  console.log(round, "sync ms", performance.now() - t0);
  console.log(backend.requestStats());
  await a.close();
}
