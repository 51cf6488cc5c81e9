/**
 * The cluster scenario shared by `deno task cluster` (Deno KV) and `deno task etcd`: four nodes in
 * separate processes allocate overlapping keys at the same moment and agree on every ID; one node
 * releases keys; one node is killed; an operator's GC reclaims the IDs nobody uses any more (the
 * released key, the dead node's keys) and keeps the others.
 *
 * The node processes end with the scenario, however it ends: they are told to stop (their stdin
 * closes, which they watch from their first moment, see `node.ts`) and killed if they have not
 * exited within {@linkcode STOP_GRACE_MS}. An aborted signal (Ctrl-C) ends the scenario at once.
 *
 * @module
 */
import { Allocator, type Backend, type GcStats } from "@idalloc/idalloc";
import { abortable, sleep } from "../../src/abort.ts";
import { ExampleError } from "../mistakes.ts";

/** Where the nodes meet. */
export type ClusterStore =
  | {
    /** An embedded Deno KV file shared by the processes. */
    readonly kind: "deno-kv";
    /** The file. */
    readonly path: string;
    /** The namespace. */
    readonly prefix: readonly string[];
  }
  | {
    /** etcd. */
    readonly kind: "etcd";
    /** Client URLs. */
    readonly endpoints: readonly string[];
    /** The key prefix. */
    readonly prefix: string;
  };

const NODE_SCRIPT = new URL("./node.ts", import.meta.url).pathname;
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;

/** Which node allocates which keys: app=batch; and app=cron; are node-d's alone. */
const PLAN: Readonly<Record<string, readonly string[]>> = {
  "node-a": ["app=web;", "app=db;", "app=api;"],
  "node-b": ["app=web;", "app=api;", "app=cache;", "app=jobs;"],
  "node-c": ["app=db;", "app=cache;", "app=web;"],
  "node-d": ["app=web;", "app=batch;", "app=cron;"],
};
const VICTIM = "node-d";
/** node-b lets go of these: app=api; is still node-a's, app=jobs; nobody else's. */
const RELEASES: readonly [string, string][] = [["node-b", "app=api;"], ["node-b", "app=jobs;"]];
/** How long the operator keeps collecting before it gives up. */
const GC_DEADLINE_MS = 30_000;
const GC_EVERY_MS = 500;
/** The nodes' lease TTL (`LEASE_TTL_MS` in node.ts). */
const NODE_LEASE_TTL_MS = 2_000;
/** How long a node may take to release its keys and exit once told to stop, before SIGKILL. */
export const STOP_GRACE_MS = 10_000;

class NodeProcess {
  readonly name: string;
  readonly #child: Deno.ChildProcess;
  readonly #lines: ReadableStreamDefaultReader<string>;
  readonly #stderr: Promise<string>;

  constructor(store: ClusterStore, name: string, keys: readonly string[]) {
    this.name = name;
    this.#child = new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--config",
        CONFIG,
        NODE_SCRIPT,
        JSON.stringify(store),
        name,
        keys.join(","),
      ],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#lines = this.#child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    this.#stderr = new Response(this.#child.stderr).text();
  }

  /** The node's `{key: id}` once it has allocated. */
  async ids(): Promise<Record<string, number>> {
    return (await this.#line()).ids;
  }

  #buffer = "";

  async #line(): Promise<Record<string, never>> {
    while (!this.#buffer.includes("\n")) {
      const { value, done } = await this.#lines.read();
      if (done) {
        // One line is an ordinary mistake the node reported (see `mistakes.ts`); more is a bug's
        // stack trace, kept as it is.
        const stderr = (await this.#stderr).trim();
        const Failure = stderr.includes("\n") ? Error : ExampleError;
        throw new Failure(`${this.name} exited: ${stderr}`);
      }
      this.#buffer += value;
    }
    const newline = this.#buffer.indexOf("\n");
    const line = this.#buffer.slice(0, newline);
    this.#buffer = this.#buffer.slice(newline + 1);
    return JSON.parse(line);
  }

  /** Releases `key` on the node; resolves to the node's `lastUse`. */
  async release(key: string): Promise<boolean> {
    const writer = this.#child.stdin.getWriter();
    await writer.write(new TextEncoder().encode(`release ${key}\n`));
    writer.releaseLock();
    return (await this.#line()).lastUse;
  }

  /** SIGKILL: no cleanup, the lease just stops being renewed. */
  async kill(): Promise<void> {
    try {
      this.#child.kill("SIGKILL");
    } catch {
      // already gone
    }
    await this.#finish();
  }

  /**
   * Asks the node to close its allocator and exit (`exit`, then the end of its stdin); kills it
   * if it is still there after {@linkcode STOP_GRACE_MS}.
   */
  async stop(): Promise<void> {
    const writer = this.#child.stdin.getWriter();
    await writer.write(new TextEncoder().encode("exit\n")).catch(() => {});
    await writer.close().catch(() => {});
    const timer = setTimeout(() => {
      try {
        this.#child.kill("SIGKILL");
      } catch {
        // already gone
      }
    }, STOP_GRACE_MS);
    try {
      await this.#finish();
    } finally {
      clearTimeout(timer);
    }
  }

  async #finish(): Promise<void> {
    await this.#child.status;
    await this.#lines.cancel().catch(() => {});
    await this.#child.stdin.close().catch(() => {});
    await this.#stderr.catch(() => {});
  }
}

function row(cells: readonly unknown[], widths: readonly number[]): string {
  return cells.map((c, i) => String(c).padEnd(widths[i])).join("  ").trimEnd();
}

/**
 * Runs the scenario on `store`; `operator` is a backend for the GC-running operator node. Prints
 * what happens; resolves to whether every check held. When `signal` aborts, the node processes
 * are stopped and it rejects with the signal's reason.
 */
export async function runCluster(
  store: ClusterStore,
  operator: Backend,
  signal: AbortSignal = new AbortController().signal,
): Promise<boolean> {
  signal.throwIfAborted();
  const nodes = Object.entries(PLAN).map(([name, keys]) => new NodeProcess(store, name, keys));
  try {
    // The steps stop at their next await; the nodes are stopped below either way.
    return await abortable(steps(nodes, operator, signal), signal);
  } finally {
    await Promise.all(nodes.map((n) => n.name === VICTIM ? n.kill() : n.stop()));
  }
}

async function steps(
  nodes: readonly NodeProcess[],
  operator: Backend,
  signal: AbortSignal,
): Promise<boolean> {
  let ok = true;
  const check = (condition: boolean, what: string) => {
    if (signal.aborted) return;
    console.log(`${condition ? "✔" : "✘"} ${what}`);
    ok &&= condition;
  };
  console.log(`1. ${nodes.length} node processes allocate overlapping keys at the same moment`);
  const ids = await Promise.all(nodes.map((n) => n.ids()));
  const keys = [...new Set(Object.values(PLAN).flat())];
  const widths = [12, ...nodes.map((n) => n.name.length + 2)];
  console.log(row(["key", ...nodes.map((n) => n.name)], widths));
  for (const key of keys) {
    console.log(row([key, ...ids.map((m) => m[key] ?? "")], widths));
  }
  const agreed = new Map<string, number>();
  for (const key of keys) {
    const held = ids.map((m) => m[key]).filter((id) => id !== undefined);
    const seen = new Set(held);
    if (held.length > 1) check(seen.size === 1, `${held.length} nodes got one ID for ${key}`);
    agreed.set(key, [...seen][0]);
  }
  check(new Set(agreed.values()).size === keys.length, "different keys got different IDs");

  console.log("\n2. nodes release keys (only a node's last use removes its reference)");
  for (const [name, key] of RELEASES) {
    const lastUse = await nodes.find((n) => n.name === name)!.release(key);
    console.log(`   ${name} releases ${key}: lastUse ${lastUse}`);
  }
  const released = new Set(RELEASES.map(([name, key]) => `${name} ${key}`));
  const users = (key: string) =>
    Object.entries(PLAN).filter(([n, ks]) => ks.includes(key) && !released.has(`${n} ${key}`))
      .map(([n]) => n);

  const victim = nodes.find((n) => n.name === VICTIM)!;
  await victim.kill();
  console.log(`\n3. ${VICTIM} is killed (SIGKILL): its lease is no longer renewed`);
  const orphans = keys.filter((k) => users(k).every((n) => n === VICTIM));

  console.log(`\n4. the operator runs GC passes until ${orphans.join(" ")} are reclaimed`);
  // The grace is the nodes' lease TTL (node.ts): GC waits that long after it first finds an ID
  // unused, so that a holder whose reference vanished has fenced itself first.
  await using gc = await Allocator.open(operator, {
    min: 256,
    max: 65535,
    gcGraceMs: NODE_LEASE_TTL_MS,
  }, { signal });
  const started = Date.now();
  const orphanIds = new Set(orphans.map((k) => agreed.get(k)!));
  const deleted = new Set<number>();
  let pass = 0;
  while ([...orphanIds].some((id) => !deleted.has(id)) && Date.now() - started < GC_DEADLINE_MS) {
    const stats: GcStats = await gc.runGc({ signal });
    pass++;
    for (const id of stats.deletedIds) deleted.add(id);
    console.log(
      `   pass ${pass}: ${stats.deleted} deleted ${JSON.stringify(stats.deletedIds)}, ` +
        `${stats.marked} marked, ${stats.alive} remain`,
    );
    await sleep(GC_EVERY_MS, signal);
  }
  const remaining = orphans.filter((k) => !deleted.has(agreed.get(k)!));
  check(remaining.length === 0, `GC reclaimed ${orphans.join(" ")}`);
  for (const key of keys.filter((k) => !orphans.includes(k))) {
    const id = agreed.get(key)!;
    check(
      !deleted.has(id) && await gc.getNoCache(key, { signal }) === id,
      `${key} keeps ID ${id}`,
    );
  }
  console.log(ok ? "\nall checks passed" : "\nSOME CHECKS FAILED");
  return ok;
}
