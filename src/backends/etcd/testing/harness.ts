/**
 * etcd's development harness: its fixture for the shared test suites (a private etcd per test
 * process), its nemesis hooks and its bench opener, loaded by kind through
 * `src/testing/harness.ts`. Not published.
 *
 * @module
 */
import type { BackendHarness } from "../../../testing/harness.ts";
import { etcdBench } from "./bench.ts";
import { etcdUnavailable } from "./cluster.ts";
import { etcdFactory } from "./fixture.ts";
import { etcdNemesis } from "./nemesis.ts";

/** etcd's harness. */
export const harness: BackendHarness = {
  kind: "etcd",
  unavailable: etcdUnavailable,
  fixture: etcdFactory,
  nemesis: etcdNemesis,
  bench: etcdBench,
};
