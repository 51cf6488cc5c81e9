/**
 * Every backend the conformance suite runs against. A new backend gets the whole suite by adding
 * its factory here.
 */
import type { BackendFactory } from "./fixture.ts";
import { kvFactory } from "./kv_fixture.ts";
import { etcdFactory } from "./etcd_fixture.ts";

export const factories: readonly BackendFactory[] = [kvFactory, etcdFactory];

/** Registers `fn` once per backend as `"<kind>: <name>"`; a backend that can't run here is skipped. */
export function testEachBackend(
  name: string,
  fn: (factory: BackendFactory, t: Deno.TestContext) => Promise<void>,
): void {
  for (const factory of factories) {
    Deno.test({
      name: `${factory.kind}: ${name}`,
      ignore: factory.unavailable !== undefined,
      fn: (t) => fn(factory, t),
    });
  }
}
