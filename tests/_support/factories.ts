/**
 * Every backend the conformance suite runs against: one factory per backend in the registry, the
 * `fixture` of its harness. A new backend gets the whole suite from its registry entry and the
 * harness in its folder (`testing/harness.ts`).
 *
 * @module
 */
import { loadHarnesses } from "../../src/testing/harness.ts";
import type { BackendFactory, BackendTraits } from "../../src/testing/fixture.ts";
import { runtime } from "../../src/testing/runtime.ts";
import { test } from "./test.ts";

const harnesses = await loadHarnesses();

/** Every backend's fixture factory, in the registry's order. */
export const factories: readonly BackendFactory[] = harnesses.map((h) => h.fixture);

/** Which backends a scenario applies to. */
export interface BackendSelection {
  /** Only these backend kinds (default: every one). */
  readonly only?: readonly string[];
  /** Only backends whose store has these traits (e.g. counters to corrupt). */
  readonly applies?: (traits: BackendTraits) => boolean;
  /**
   * Backend kinds where the scenario applies but its fix is still to come: registered as ignored,
   * with the reason in the name, so that they stay visible.
   */
  readonly pending?: Readonly<Record<string, string>>;
  /** Registered as ignored on this runtime, with this reason in the name (it runs on another). */
  readonly notHere?: string;
}

/**
 * Like {@linkcode testEachBackend}, and once more per backend with group commit off (`"<kind>:
 * <name> [group commit off]"`): the conformance scenarios hold either way.
 */
export function testEachBackendAndMode(
  name: string,
  fn: (factory: BackendFactory) => Promise<void>,
  selection: BackendSelection = {},
): void {
  testEachBackend(name, fn, selection);
  // A backend without group commit would run the very same scenario again.
  const applies = selection.applies;
  testEachBackend(`${name} [group commit off]`, (factory) =>
    fn({
      ...factory,
      create: (options) => factory.create({ ...options, groupCommit: false }),
    }), {
    ...selection,
    applies: (traits) => traits.groupCommit && (applies?.(traits) ?? true),
    ...(GROUP_COMMIT_OFF_ON_DENO_ONLY === undefined
      ? {}
      : { notHere: GROUP_COMMIT_OFF_ON_DENO_ONLY }),
  });
}

/**
 * Why Node.js and Bun leave the `[group commit off]` variants to Deno (listed as ignored, with
 * this reason): group commit is the core's batching of store writes, the same code on every
 * runtime; what differs between runtimes is below it (the etcd client's gRPC, `node:https`, the
 * KV file), which the default mode's scenarios cover. They were 18 % of Node's test time (152 of
 * 850 test-seconds, measured here).
 */
const GROUP_COMMIT_OFF_ON_DENO_ONLY = runtime === "deno"
  ? undefined
  : "runs under Deno: the core's batching is the same on every runtime";

/** Registers `fn` once per backend as `"<kind>: <name>"`; a backend that can't run here is skipped. */
export function testEachBackend(
  name: string,
  fn: (factory: BackendFactory) => Promise<void>,
  selection: BackendSelection = {},
): void {
  for (const factory of factories) {
    if (selection.only && !selection.only.includes(factory.kind)) continue;
    if (selection.applies && !selection.applies(factory.traits)) continue;
    const pending = selection.pending?.[factory.kind];
    const unavailable = factory.unavailable ?? selection.notHere;
    test({
      name: `${factory.kind}: ${name}${pending ? ` (pending: ${pending})` : ""}${
        unavailable ? ` (unavailable here: ${unavailable})` : ""
      }`,
      ignore: unavailable !== undefined || pending !== undefined,
      fn: () => fn(factory),
    });
  }
}
