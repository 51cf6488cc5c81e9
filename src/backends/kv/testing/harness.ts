/**
 * Deno KV's development harness: its fixture for the shared test suites, its nemesis hooks and
 * its bench opener, loaded by kind through `src/testing/harness.ts`, which finds it in this folder by the driver. Not published.
 *
 * @module
 */
import type { BackendHarness } from "../../../testing/harness_contract.ts";
import { kvBench } from "./bench.ts";
import { kvFactory } from "./fixture.ts";
import { kvNemesis } from "./nemesis.ts";
import { kvUnavailable } from "./open.ts";

/** Deno KV's harness. */
export const harness: BackendHarness = {
  kind: "deno-kv",
  // Deno KV ships with Deno; on Node.js the @deno/kv package opens the same files.
  unavailable: kvUnavailable,
  fixture: kvFactory,
  nemesis: kvNemesis,
  bench: kvBench,
};
