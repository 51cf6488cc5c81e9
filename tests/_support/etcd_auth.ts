/**
 * Turns on etcd's user/password authentication for a test cluster.
 *
 * @example
 * ```ts ignore
 * // Needs an etcd binary; tests/backends/etcd/cli_security.test.ts runs it.
 * await using etcd = await startEtcd();
 * await enableAuth(etcd.endpoints, "s3cret");
 * ```
 * @module
 */
import type { Etcd3 } from "etcd3";
import { rawClient } from "../../src/backends/etcd/testing/fixture.ts";

/**
 * Creates user `root` (role `root`) with `rootPassword`, lets `setup` add further users and roles
 * while that is still possible without credentials, then enables authentication.
 */
export async function enableAuth(
  endpoints: readonly string[],
  rootPassword: string,
  setup?: (raw: Etcd3) => Promise<void>,
): Promise<void> {
  const raw = rawClient(endpoints);
  try {
    await raw.role("root").create();
    await raw.user("root").create(rootPassword);
    await raw.user("root").addRole("root");
    await setup?.(raw);
    await raw.auth.authEnable();
  } finally {
    raw.close();
  }
}
