/**
 * One node of the cluster example, in its own process. It allocates the keys it is given (all at
 * once, racing the other nodes), prints `{"node", "ids": {key: id}}` as one JSON line, then keeps
 * its lease alive, releasing keys when told (`release <key>` on stdin), until it reads `exit` or
 * its stdin ends (the parent stopped or died): then it releases what it still holds, so that two
 * GC passes can remove everything the example wrote (or it is killed, and its references lapse
 * with its lease). A node whose stdin ends before it holds its keys exits at once.
 *
 * `deno run -A examples/cluster/node.ts '<store JSON>' <node> <key,key,…>`
 *
 * @module
 */
import { Allocator, type Backend, DenoKvBackend } from "@idalloc/idalloc";
import { EtcdBackend } from "@idalloc/idalloc/etcd";
import { exitOnMistakes } from "../mistakes.ts";
import type { ClusterStore } from "./scenario.ts";

exitOnMistakes(Deno.args[1] ?? "node");

const [storeJson, node, keyList] = Deno.args;
const store: ClusterStore = JSON.parse(storeJson);
/** Short, so that a killed node's references lapse within seconds. */
const LEASE_TTL_MS = 2_000;

// The parent holds this process's stdin: it ends when the parent stops the node or dies, by any
// signal. It is read from the first moment, so that a node still connecting or allocating then
// ends too (a node waiting on a store that refused it once outlived its interrupted parent).
const commands = stdinLines();
let holding = false;
void commands.ended.then(() => {
  // Until the keys are held there is nothing to release: the lease lapses on its own.
  if (!holding) Deno.exit(0);
});

let kv: Deno.Kv | undefined;
let backend: Backend;
if (store.kind === "deno-kv") {
  kv = await Deno.openKv(store.path);
  backend = new DenoKvBackend(kv, {
    prefix: store.prefix,
    node,
    pollIntervalMs: 100,
    maxClockSkewMs: 300,
  });
} else {
  backend = await EtcdBackend.connect({ endpoints: store.endpoints, prefix: store.prefix, node });
}
const allocator = await Allocator.open(backend, { min: 256, max: 65535, leaseTtlMs: LEASE_TTL_MS });

const keys = keyList.split(",");
const held = new Set(keys);
const results = await Promise.all(keys.map((key) => allocator.allocate(key)));
const ids = Object.fromEntries(keys.map((key, i) => [key, results[i].id]));
holding = true;
console.log(JSON.stringify({ node, ids }));

// Hold the keys (the allocator renews the lease in the background) and answer commands, one per
// line: `release <key>` prints `{"node", "key", "lastUse"}`; `exit`, or the end of stdin, stops.
for (let line; (line = await commands.next()) !== undefined;) {
  const [command, key] = line.trim().split(" ");
  if (command === "exit") break;
  if (command === "release") {
    const { lastUse } = await allocator.release(key);
    held.delete(key);
    console.log(JSON.stringify({ node, key, lastUse }));
  }
}
for (const key of held) await allocator.release(key);
await allocator.close();
if (backend instanceof EtcdBackend) await backend.close();
kv?.close();
Deno.exit(0);

/** The lines of stdin, read from now on; `ended` resolves when stdin closes. */
function stdinLines(): { next(): Promise<string | undefined>; ended: Promise<void> } {
  const lines: string[] = [];
  let closed = false;
  let wake: (() => void) | undefined;
  const ended = (async () => {
    let buffer = "";
    for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      let newline;
      while ((newline = buffer.indexOf("\n")) >= 0) {
        lines.push(buffer.slice(0, newline));
        buffer = buffer.slice(newline + 1);
      }
      wake?.();
    }
  })().catch(() => {}).finally(() => {
    closed = true;
    wake?.();
  });
  return {
    async next() {
      while (lines.length === 0 && !closed) await new Promise<void>((r) => (wake = r));
      return lines.shift();
    },
    ended,
  };
}
