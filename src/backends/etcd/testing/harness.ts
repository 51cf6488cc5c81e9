/**
 * etcd's development harness: its fixture for the shared test suites (a private etcd per test
 * process), its nemesis hooks, its bench opener and a private etcd for the examples, loaded by kind
 * through `src/testing/harness.ts`. Not published.
 *
 * @module
 */
import type { BackendHarness } from "../../../testing/harness_contract.ts";
import { etcdBench } from "./bench.ts";
import { etcdUnavailable, findEtcd, startEtcd } from "./cluster.ts";
import { etcdFactory } from "./fixture.ts";
import { etcdNemesis } from "./nemesis.ts";

/** etcd's harness. */
export const harness: BackendHarness = {
  kind: "etcd",
  unavailable: etcdUnavailable,
  fixture: etcdFactory,
  nemesis: etcdNemesis,
  bench: etcdBench,
  server: async () => findEtcd() === undefined ? undefined : await startEtcd(),
};
