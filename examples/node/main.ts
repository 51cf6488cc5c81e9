/**
 * idalloc on Node.js (also runs unchanged on Bun and Deno): two nodes of a cluster agree on IDs
 * for keys and on security identities for label sets, then the run prints its allocation rates.
 *
 * From a checkout, after `deno install` (which fills `node_modules`):
 *
 * ```sh
 * node --import ./compat/node.ts examples/node/main.ts             # etcd
 * node --import ./compat/node.ts examples/node/main.ts --store kv  # Deno KV file via @deno/kv
 * bun --preload ./compat/bun.ts examples/node/main.ts              # etcd
 * deno task node-example                                           # the same on Deno
 * ```
 *
 * etcd: `ETCD_ENDPOINTS` (comma-separated client URLs) if set, else a private etcd on loopback
 * when an `etcd` binary is installed, else it explains and exits 0. `--count N` sets how many keys
 * the rate runs allocate (default 2000); `--json` ends the output with them as one JSON line (for
 * `bench/runtimes.ts`). Exits 1 if a check fails.
 *
 * @module
 */
import process from "node:process";
import { parseArgs } from "node:util";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
// A project that installed idalloc imports "@idalloc/idalloc", "@idalloc/idalloc/etcd", … instead.
import { Allocator, type Backend } from "../../mod.ts";
import { IdentityAllocator, Labels } from "../../src/identity/mod.ts";
import { EtcdBackend } from "../../src/backends/etcd/mod.ts";
import { DenoKvBackend } from "../../src/backends/kv/mod.ts";
import { loadHarness } from "../../src/testing/harness.ts";

const runtime = "Deno" in globalThis ? "deno" : "Bun" in globalThis ? "bun" : "node";
const USAGE = "usage: main.ts [--store etcd|kv] [--count N] [--json]";

/** Ends the example on a mistake in its arguments: one line, exit code 1. */
function usageError(message: string): never {
  console.error(`node example: ${message}\n${USAGE}`);
  process.exit(1);
}

let values: { store: string; count: string; json: boolean };
try {
  values = parseArgs({
    options: {
      store: { type: "string", default: "etcd" },
      count: { type: "string", default: "2000" },
      json: { type: "boolean", default: false },
    },
  }).values;
} catch (err) {
  usageError(err instanceof Error ? err.message : String(err));
}
if (values.store !== "etcd" && values.store !== "kv") {
  usageError(`--store takes etcd or kv, not '${values.store}'`);
}
const count = Number(values.count);
if (!Number.isSafeInteger(count) || count < 1) {
  usageError(`--count takes a positive integer, not '${values.count}'`);
}

/** A store both nodes share: a backend per node, and how to let go of it. */
interface Store extends AsyncDisposable {
  readonly name: string;
  backend(node: string): Promise<Backend>;
}

let failed = false;
function check(condition: boolean, what: string): void {
  console.log(`  ${condition ? "✔" : "✘"} ${what}`);
  failed ||= !condition;
}

const store = values.store === "kv" ? await kvStore() : await etcdStore();
if (store === undefined) process.exit(0);
try {
  await using _store = store;
  console.log(`idalloc on ${runtime} ${versionOf(runtime)}, ${store.name}\n`);
  await using a = await Allocator.open(await store.backend("node-a"), { max: 65535 });
  await using b = await Allocator.open(await store.backend("node-b"), { max: 65535 });

  console.log("1. two nodes, one key, one ID");
  const first = await a.allocate("app=web;");
  const second = await b.allocate("app=web;");
  console.log(`  app=web; → ${first.id} on node-a (isNew ${first.isNew}), ${second.id} on node-b`);
  check(first.id === second.id && first.isNew && !second.isNew, "the same ID on both nodes");

  console.log("\n2. label sets → Cilium security identities");
  await using ids = await IdentityAllocator.open(await store.backend("10.0.0.1"), { clusterId: 1 });
  const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
  const { identity } = await ids.allocate(labels);
  console.log(`  ${labels} → ${identity.id}`);
  check(identity.id >= 65536 && identity.id < 131072, "in cluster 1's range");
  check((await ids.allocate(Labels.parse(["reserved:host"]))).identity.id === 1, "host is 1");
  await ids.release(identity);

  console.log(`\n3. rates on ${runtime} (${count} keys, one allocator, sequential)`);
  const keys = Array.from({ length: count }, (_, i) => `rate/${i}`);
  const rate = async (what: string, op: (key: string) => Promise<unknown>) => {
    const t0 = performance.now();
    for (const key of keys) await op(key);
    const perSecond = Math.round(count / ((performance.now() - t0) / 1000));
    console.log(`  ${what.padEnd(22)} ${perSecond.toLocaleString("en-US")}/s`);
    rates[what] = perSecond;
  };
  const rates: Record<string, number> = {};
  await rate("new keys", (k) => a.allocate(k));
  await rate("join (2nd node)", (k) => b.allocate(k));
  await rate("cached re-allocation", (k) => a.allocate(k));
  for (const node of [a, b]) for (const key of keys) await node.release(key);
  await a.release("app=web;");
  await b.release("app=web;");
  check(true, "released everything");
  if (values.json) console.log(JSON.stringify({ runtime, rates }));
} catch (err) {
  console.error(`node example: ${err instanceof Error ? err.message : err}`);
  failed = true;
}
process.exitCode = failed ? 1 : 0;

function versionOf(name: string): string {
  if (name === "deno") return Deno.version.deno;
  return process.versions.bun ?? process.versions.node;
}

/** etcd: `ETCD_ENDPOINTS`, else a private etcd, else `undefined` after saying why. */
async function etcdStore(): Promise<Store | undefined> {
  let endpoints = process.env.ETCD_ENDPOINTS?.split(",").map((e) => e.trim()).filter(Boolean);
  let stop = async () => {};
  if (!endpoints?.length) {
    // The repository's etcd harness starts a private etcd where one is installed.
    const etcd = await (await loadHarness("etcd")).server?.();
    if (etcd === undefined) {
      console.log("skipped: no etcd. Set ETCD_ENDPOINTS=http://127.0.0.1:2379 or install one.");
      return undefined;
    }
    endpoints = [...etcd.endpoints];
    stop = () => etcd.close();
  }
  // A fresh prefix per run keeps runs apart on a shared etcd.
  const prefix = `idalloc-node-example/${crypto.randomUUID().slice(0, 8)}`;
  const opened: EtcdBackend[] = [];
  return {
    name: `etcd at ${endpoints.join(",")}`,
    async backend(node) {
      const backend = await EtcdBackend.connect({ endpoints: endpoints!, prefix, node });
      opened.push(backend);
      return backend;
    },
    async [Symbol.asyncDispose]() {
      for (const backend of opened) await backend.close();
      await stop();
    },
  };
}

/**
 * A Deno KV file in a temp dir: `Deno.openKv` on Deno, the `@deno/kv` package on Node.js. Not on
 * Bun: `@deno/kv` stores values in V8's serialization format, which Bun does not have.
 */
async function kvStore(): Promise<Store> {
  if (runtime === "bun") {
    console.error("node example: the Deno KV backend runs on Deno and Node.js, not on Bun");
    process.exit(1);
  }
  const dir = await mkdtemp(join(tmpdir(), "idalloc-node-example-"));
  const path = join(dir, "ids.kv");
  const handles: Deno.Kv[] = [];
  const open = async (): Promise<{ kv: Deno.Kv; kvU64?: typeof Deno.KvU64 }> => {
    if (runtime === "deno") return { kv: await Deno.openKv(path) };
    // On Node.js: the @deno/kv package (a native SQLite store, the same file format).
    const { openKv, KvU64 } = await import("@deno/kv");
    return { kv: await openKv(path) as unknown as Deno.Kv, kvU64: KvU64 as typeof Deno.KvU64 };
  };
  return {
    name: `Deno KV file ${path}`,
    async backend(node) {
      const { kv, kvU64 } = await open();
      handles.push(kv);
      return new DenoKvBackend(kv, { prefix: ["node-example"], node, kvU64 });
    },
    async [Symbol.asyncDispose]() {
      for (const kv of handles) kv.close();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
