/**
 * A worker process of the `k8s-scale` bench (`k8s_scale.ts` spawns several): it hosts many
 * simulated nodes, each a real idalloc session — its own `K8sBackend` (own client and
 * connections), its own node Lease, its own `Allocator` with its own watch and cache — opened
 * through the library's public entries only, so the bench measures whatever layout the backend
 * writes today.
 *
 * It reads commands as JSON lines on stdin and answers one JSON line each on stdout
 * ({@linkcode WorkerReply}); `at` is a wall-clock time (ms since the epoch), the same for every
 * worker, so the nodes of all workers start together:
 *
 * - `{"cmd": "join", "at", "shared", "own": 5}`: every node allocates the `shared` key and `own`
 *   keys of its own at once; each node's time until it holds all of them, and the shared key's ID;
 * - `{"cmd": "race", "at", "key", "below": 200}`: every node whose index is below `below`
 *   allocates `key`; each one's time to an answer, the ID and whether it created it;
 * - `{"cmd": "close"}`: closes every node (their Leases go) and ends.
 *
 * deno run -A bench/k8s_scale_node.ts '<WorkerConfig json>'
 *
 * @module
 */
import process from "node:process";
import { Allocator } from "../mod.ts";
import { K8sBackend } from "../src/backends/k8s/mod.ts";
import { linesOf } from "./scale.ts";

/** What `k8s_scale.ts` tells a worker when it spawns it. */
export interface WorkerConfig {
  readonly kubeconfig: string;
  readonly context: string;
  /** The identity resource's group (one fresh group per node count). */
  readonly group: string;
  /** The global index of this worker's first node. */
  readonly first: number;
  /** How many nodes this worker hosts. */
  readonly count: number;
  /** Node names are `<prefix><index>`. */
  readonly prefix: string;
}

/** A command (see the module doc). */
export type WorkerCommand =
  | { readonly cmd: "join"; readonly at: number; readonly shared: string; readonly own: number }
  | { readonly cmd: "race"; readonly at: number; readonly key: string; readonly below: number }
  | { readonly cmd: "close" };

/** One node's answer to a `join` or a `race`. */
export interface NodeAnswer {
  /** The node's global index. */
  readonly node: number;
  /** From `at` until the node held what it asked for, ms. */
  readonly ms: number;
  /** The ID of the shared (join) or raced key. */
  readonly id: number;
  /** Whether this node's allocation created the identity. */
  readonly isNew: boolean;
  /** Allocations that failed and were tried again (a loaded server answers 504 or times out). */
  readonly retries: number;
  /** Why the node still did not hold it after {@linkcode TRIES} tries (`id` is then -1). */
  readonly failed?: string;
}

/** A line on stdout. */
export type WorkerReply =
  | { readonly type: "opened"; readonly ms: number; readonly count: number }
  | {
    readonly type: "answers";
    readonly answers: readonly NodeAnswer[];
    /** Errors thrown where nothing catches them (inside the library) in this worker so far. */
    readonly uncaught: number;
  }
  | { readonly type: "closed" }
  | { readonly type: "error"; readonly message: string };

/** Sessions opened at once per worker: enough to overlap round trips, few enough not to time out. */
const OPEN_WIDTH = 4;

interface SimNode {
  readonly index: number;
  readonly name: string;
  readonly backend: K8sBackend;
  readonly alloc: Allocator;
}

const say = (reply: WorkerReply) => console.log(JSON.stringify(reply));

async function openNode(config: WorkerConfig, index: number): Promise<SimNode> {
  const name = `${config.prefix}${index}`;
  const backend = await K8sBackend.connect({
    node: name,
    kubeconfig: config.kubeconfig,
    context: config.context,
    resource: { group: config.group },
    // Nothing of Cilium's runs in these groups: no endpoints to read.
    endpoints: false,
    // Hundreds of sessions share two cores with the API server: the defaults (5 s to connect,
    // 10 s a request) are for a node that has a machine to itself.
    connectTimeoutMs: 120_000,
    requestTimeoutMs: 60_000,
  });
  try {
    const alloc = await Allocator.open(backend, { min: 256, max: 65535 });
    await alloc.waitForInitialSync();
    return { index, name, backend, alloc };
  } catch (err) {
    await backend.close();
    throw err;
  }
}

async function openAll(config: WorkerConfig): Promise<SimNode[]> {
  const nodes: SimNode[] = [];
  let next = 0;
  await Promise.all(Array.from({ length: OPEN_WIDTH }, async () => {
    while (next < config.count) nodes.push(await openNode(config, config.first + next++));
  }));
  return nodes.sort((a, b) => a.index - b.index);
}

async function sleepUntil(at: number): Promise<void> {
  const wait = at - Date.now();
  if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
}

/** Tries per allocation: as an agent would, a node tries again after a failed allocation. */
const TRIES = 5;

/** `n` allocates `key`, trying again after a failure; counts the failures in `retries`. */
async function allocate(n: SimNode, key: string, retries: { count: number }) {
  for (let attempt = 1;; attempt++) {
    try {
      return await n.alloc.allocate(key);
    } catch (err) {
      if (attempt >= TRIES) throw err;
      retries.count++;
      await new Promise((resolve) => setTimeout(resolve, 1_000 * attempt));
    }
  }
}

/** `n`'s answer: `keys` all allocated (the first one's ID), or why not — a figure, not a crash. */
async function answer(n: SimNode, at: number, keys: readonly string[]): Promise<NodeAnswer> {
  const retries = { count: 0 };
  try {
    const [first] = await Promise.all(keys.map((k) => allocate(n, k, retries)));
    const { id, isNew } = first;
    return { node: n.index, ms: Date.now() - at, id, isNew, retries: retries.count };
  } catch (err) {
    const failed = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    return {
      node: n.index,
      ms: Date.now() - at,
      id: -1,
      isNew: false,
      retries: retries.count,
      failed,
    };
  }
}

async function join(nodes: readonly SimNode[], at: number, shared: string, own: number) {
  await sleepUntil(at);
  return await Promise.all(nodes.map((n) => {
    const keys = Array.from({ length: own }, (_, j) => `k8s:app=own-${n.name}-${j};`);
    return answer(n, at, [shared, ...keys]);
  }));
}

async function race(nodes: readonly SimNode[], at: number, key: string, below: number) {
  await sleepUntil(at);
  return await Promise.all(nodes.filter((n) => n.index < below).map((n) => answer(n, at, [key])));
}

async function closeAll(nodes: readonly SimNode[]): Promise<void> {
  await Promise.all(nodes.map(async (n) => {
    await n.alloc.close();
    await n.backend.close();
  }));
}

let uncaught = 0;

/**
 * Counts and logs an error nothing caught (the library's, e.g. a pooled connection's abort) and
 * keeps the worker alive: one such error would end every node of the process, and the bench
 * reports how many there were instead.
 */
function survive(event: Event & { preventDefault(): void }, what: unknown): void {
  uncaught++;
  console.error(`k8s-scale worker: uncaught: ${what instanceof Error ? what.stack : what}`);
  event.preventDefault();
}

async function main(config: WorkerConfig): Promise<void> {
  globalThis.addEventListener("error", (e) => survive(e, e.error));
  globalThis.addEventListener("unhandledrejection", (e) => survive(e, e.reason));
  const t0 = performance.now();
  const nodes = await openAll(config);
  say({ type: "opened", ms: performance.now() - t0, count: nodes.length });
  for await (const c of linesOf<WorkerCommand>(Deno.stdin.readable)) {
    if (c.cmd === "join") {
      say({ type: "answers", answers: await join(nodes, c.at, c.shared, c.own), uncaught });
    } else if (c.cmd === "race") {
      say({ type: "answers", answers: await race(nodes, c.at, c.key, c.below), uncaught });
    } else break;
  }
  await closeAll(nodes);
  say({ type: "closed" });
}

if (import.meta.main) {
  try {
    await main(JSON.parse(process.argv[2]) as WorkerConfig);
  } catch (err) {
    say({ type: "error", message: err instanceof Error ? err.stack ?? err.message : String(err) });
    process.exit(1);
  }
  // The stdin reader would keep the process alive.
  process.exit(0);
}
