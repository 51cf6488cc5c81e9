/**
 * One demo node in its own process. It opens the shared Deno KV file and answers commands read
 * from stdin, one JSON object per line, with one JSON line on stdout:
 * `{"op":"allocate","key":"app=web;"}`, `{"op":"release","key":…}`, `{"op":"exit"}`.
 *
 * @module
 */
import { Allocator, DenoKvBackend } from "../../mod.ts";

const [path, node] = Deno.args;
using kv = await Deno.openKv(path);
const backend = new DenoKvBackend(kv, {
  prefix: ["idalloc", "demo"],
  node,
  pollIntervalMs: 200,
  maxClockSkewMs: 500,
});
await using alloc = await Allocator.open(backend, { min: 256, max: 65535, leaseTtlMs: 3_000 });

const lines = Deno.stdin.readable.pipeThrough(new TextDecoderStream());
let buffer = "";
for await (const chunk of lines) {
  buffer += chunk;
  let newline;
  while ((newline = buffer.indexOf("\n")) >= 0) {
    const line = buffer.slice(0, newline);
    buffer = buffer.slice(newline + 1);
    const command = JSON.parse(line) as { op: string; key?: string };
    if (command.op === "exit") Deno.exit(0);
    try {
      const result = command.op === "allocate"
        ? await alloc.allocate(command.key!)
        : await alloc.release(command.key!);
      console.log(JSON.stringify({ ok: true, node, ...command, ...result }));
    } catch (err) {
      console.log(JSON.stringify({ ok: false, node, ...command, error: String(err) }));
    }
  }
}
