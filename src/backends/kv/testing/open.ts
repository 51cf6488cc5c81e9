/**
 * Opens a KV file on the runtime the tests run on: `Deno.openKv` under Deno, the `@deno/kv` npm
 * package's `openKv` on Node.js (which then needs that package's `KvU64`, see the backend's
 * `kvU64` option). Bun cannot open one: `@deno/kv` stores values in V8's serialization format,
 * which Bun (JavaScriptCore) does not provide.
 *
 * @example
 * ```ts ignore
 * // ignored: writes a KV file; the KV fixture uses it.
 * const { kv, kvU64 } = await openKvFile("/tmp/ids.kv");
 * const backend = new DenoKvBackend(kv, { prefix: ["ids"], node: "a", kvU64 });
 * ```
 * @module
 */
import type { KvU64Class } from "../options.ts";
import { runtime } from "../../../testing/runtime.ts";

const DENO_KV_NPM = "npm:@deno/kv@0.14.0";

/** A KV handle and, outside Deno, the counter class its package uses. */
export interface OpenedKv {
  readonly kv: Deno.Kv;
  /** `undefined` under Deno (`Deno.KvU64` is the backend's default). */
  readonly kvU64?: KvU64Class;
}

/** Why KV files cannot be opened on this runtime, or `undefined` when they can. */
export function kvUnavailable(): string | undefined {
  if (runtime === "bun") {
    return "@deno/kv needs V8's serialization format, which Bun does not have";
  }
  return undefined;
}

/** Opens (creating if need be) the KV file at `path` on this runtime. */
export async function openKvFile(path: string): Promise<OpenedKv> {
  if (runtime === "deno") return { kv: await Deno.openKv(path) };
  const why = kvUnavailable();
  if (why !== undefined) throw new Error(`cannot open a KV file here: ${why}`);
  const npm = await import(DENO_KV_NPM) as {
    openKv(path: string): Promise<Deno.Kv>;
    KvU64: KvU64Class;
  };
  return { kv: await npm.openKv(path), kvU64: npm.KvU64 };
}
