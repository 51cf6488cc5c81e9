/**
 * Deno KV's bench opener: a fresh KV file per measurement, a node's backend on it, and the raw
 * ceiling — one atomic commit per key that writes what a new key's allocation writes (master, key
 * index, reference, change-feed entry, generation counter), checked like one.
 *
 * @module
 */
import type { Backend } from "../../../allocator/backend.ts";
import type { BenchHooks, RawWriter } from "../../../testing/bench.ts";
import { DenoKvBackend } from "../mod.ts";

/** The KV file a measurement's children open. */
function filePath(where: unknown): string {
  if (typeof where !== "string") throw new TypeError(`a Deno KV bench store is a file path`);
  return where;
}

async function open(
  where: unknown,
  prefix: string,
  node: string,
  options?: Record<string, unknown>,
): Promise<Backend & AsyncDisposable> {
  const kv = await Deno.openKv(filePath(where));
  const backend = new DenoKvBackend(kv, { prefix: [prefix], node, ...options });
  return Object.assign(backend, {
    [Symbol.asyncDispose]: () => Promise.resolve(kv.close()),
  });
}

async function raw(where: unknown): Promise<RawWriter> {
  const kv = await Deno.openKv(filePath(where));
  return {
    async write(i: number, key: string): Promise<void> {
      const res = await kv.atomic()
        .check({ key: ["raw", "key", key], versionstamp: null })
        .check({ key: ["raw", "id", i], versionstamp: null })
        .sum(["raw", "gen"], 1n)
        .set(["raw", "id", i], { key })
        .set(["raw", "key", key], { id: i })
        .set(["raw", "ref", key, "n"], { id: i, lease: "l" })
        .set(["raw", "log", Date.now(), "n", String(i)], { id: i, key }, {
          expireIn: 600_000,
        })
        .commit();
      if (!res.ok) throw new Error("raw commit failed");
    },
    [Symbol.asyncDispose]: () => Promise.resolve(kv.close()),
  };
}

/** Deno KV's bench hooks. */
export const kvBench: BenchHooks = {
  extraCells: () => [],
  async fresh() {
    const dir = await Deno.makeTempDir({ prefix: "idalloc-bench-" });
    return {
      where: `${dir}/bench.kv`,
      [Symbol.asyncDispose]: () => Deno.remove(dir, { recursive: true }),
    };
  },
  open,
  raw,
  example: {
    // The example's own Deno KV file, which it removes.
    start: () =>
      Promise.resolve({
        args: ["--store", "kv"],
        env: {},
        [Symbol.asyncDispose]: () => Promise.resolve(),
      }),
    unsupported: { bun: "@deno/kv needs V8 serialization" },
  },
};
