/**
 * Test registration that runs on Deno, Node.js and Bun. Under Deno, {@linkcode test} is
 * `Deno.test` (its runner, sanitizers and filters); under Node.js and Bun it collects the test for
 * `tests/_support/runner.ts`, which runs the same bodies. The suites that must hold on every
 * runtime (conformance, identity) register through it.
 *
 * @example
 * ```ts ignore
 * test("an ID is a number", () => assert.equal(typeof 1, "number"));
 * test({ name: "Deno only", ignore: runtime !== "deno", fn: () => {} }); // runtime.ts
 * ```
 * @module
 */
import { runtime } from "../../src/testing/runtime.ts";

/** One test: a name, its body, and whether it is registered as ignored (still listed). */
export interface TestDefinition {
  readonly name: string;
  readonly ignore?: boolean;
  readonly fn: () => void | Promise<void>;
}

const collected: TestDefinition[] = [];

/** Registers a test (see the module doc). */
export function test(name: string, fn: () => void | Promise<void>): void;
/** Registers a test given as a definition. */
export function test(definition: TestDefinition): void;
export function test(
  nameOrDefinition: string | TestDefinition,
  fn?: () => void | Promise<void>,
): void {
  const definition = typeof nameOrDefinition === "string"
    ? { name: nameOrDefinition, fn: fn! }
    : nameOrDefinition;
  if (runtime === "deno") {
    Deno.test({ name: definition.name, ignore: definition.ignore, fn: () => definition.fn() });
  } else {
    collected.push(definition);
  }
}

/** The tests collected so far outside Deno, in registration order (for the runner). */
export function collectedTests(): readonly TestDefinition[] {
  return collected;
}
