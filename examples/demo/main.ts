/**
 * `deno task demo`: a three-node cluster on one embedded Deno KV file. Each node is its own
 * process; they agree on IDs, share and release them, one node is killed, and a GC reclaims the
 * IDs that only the dead node used.
 *
 * @module
 */
import { Allocator, DenoKvBackend } from "../../mod.ts";

const NODE = new URL("./node.ts", import.meta.url).pathname;
const dir = await Deno.makeTempDir({ prefix: "idalloc-demo-" });
const path = `${dir}/ids.kv`;

class NodeProcess {
  readonly name: string;
  readonly #child: Deno.ChildProcess;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #reader: ReadableStreamDefaultReader<string>;
  #buffer = "";

  constructor(name: string) {
    this.name = name;
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", NODE, path, name],
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    this.#writer = this.#child.stdin.getWriter();
    this.#reader = this.#child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  }

  async send(op: string, key?: string): Promise<Record<string, unknown>> {
    await this.#writer.write(new TextEncoder().encode(JSON.stringify({ op, key }) + "\n"));
    while (!this.#buffer.includes("\n")) {
      const { value, done } = await this.#reader.read();
      if (done) throw new Error(`node ${this.name} exited`);
      this.#buffer += value;
    }
    const newline = this.#buffer.indexOf("\n");
    const line = this.#buffer.slice(0, newline);
    this.#buffer = this.#buffer.slice(newline + 1);
    return JSON.parse(line);
  }

  async kill(): Promise<void> {
    this.#child.kill("SIGKILL");
    await this.#child.status;
    await this.#reader.cancel().catch(() => {});
    await this.#writer.close().catch(() => {});
  }

  async stop(): Promise<void> {
    await this.#writer.write(new TextEncoder().encode(JSON.stringify({ op: "exit" }) + "\n"));
    await this.#child.status;
    await this.#reader.cancel().catch(() => {});
    await this.#writer.close().catch(() => {});
  }
}

function table(title: string, rows: Array<Record<string, unknown>>): void {
  console.log(`\n${title}`);
  console.table(rows);
}

const nodes = ["node-a", "node-b", "node-c"].map((n) => new NodeProcess(n));
const [a, b, c] = nodes;
const plan: Array<[NodeProcess, string]> = [
  [a, "app=web;"],
  [a, "app=db;"],
  [b, "app=web;"],
  [b, "app=api;"],
  [c, "app=web;"],
  [c, "app=db;"],
  [c, "app=batch;"],
];
const allocations = await Promise.all(plan.map(([node, key]) => node.send("allocate", key)));
table(
  "1. Three processes allocate keys at once; the same key gets the same ID everywhere",
  allocations.map((r) => ({
    node: r.node,
    key: r.key,
    id: r.id,
    isNew: r.isNew,
    firstUse: r.firstUse,
  })),
);

const release = await b.send("release", "app=api;");
table("2. node-b releases app=api; (its last use)", [{
  node: release.node,
  key: release.key,
  lastUse: release.lastUse,
}]);

await c.kill();
console.log("\n3. node-c is killed (SIGKILL): its lease is no longer renewed.");

// The operator: an allocator in this process that only collects garbage.
using kv = await Deno.openKv(path);
const backend = new DenoKvBackend(kv, {
  prefix: ["idalloc", "demo"],
  node: "operator",
  pollIntervalMs: 200,
  maxClockSkewMs: 500,
});
await using operator = await Allocator.open(backend, { min: 256, max: 65535 });
const gcRows: Array<Record<string, unknown>> = [];
const deadline = Date.now() + 30_000;
while (Date.now() < deadline) {
  const stats = await operator.runGc();
  gcRows.push({
    pass: gcRows.length + 1,
    alive: stats.alive,
    marked: stats.marked,
    deleted: stats.deletedIds.join(", ") || "-",
  });
  const remaining = await Promise.all(
    ["app=api;", "app=batch;"].map((k) => operator.getNoCache(k)),
  );
  if (remaining.every((id) => id === undefined)) break;
  await new Promise((r) => setTimeout(r, 1_000));
}
table("4. GC passes (an ID is deleted after two passes find it unused and unchanged)", gcRows);

await operator.waitForInitialSync();
const final: Array<Record<string, unknown>> = [];
for (const key of ["app=web;", "app=db;", "app=api;", "app=batch;"]) {
  final.push({ key, id: (await operator.getNoCache(key)) ?? "(collected)" });
}
table("5. What the store holds now", final);

await a.stop();
await b.stop();
await Deno.remove(dir, { recursive: true });
