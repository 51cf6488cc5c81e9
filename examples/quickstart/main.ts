/**
 * `deno task quickstart`: one allocator on an embedded Deno KV file (`./quickstart.kv`, or the path
 * given as the first argument). Run it twice: the second run finds the same IDs (`isNew: false`).
 *
 * @module
 */
import { Allocator, DenoKvBackend } from "@idalloc/idalloc";
import { exitOnMistakes, openKvFile } from "../mistakes.ts";

exitOnMistakes("quickstart");
using kv = await openKvFile(Deno.args[0] ?? "./quickstart.kv", "the first argument");
const backend = new DenoKvBackend(kv, { prefix: ["quickstart"], node: "node-a" });
// Every run is node-a starting again, while the last run's lease may still be live.
await using ids = await Allocator.open(backend, { min: 256, max: 65535, restart: true });

for (const key of ["app=web;", "app=db;", "app=web;"]) {
  const { id, isNew, firstUse } = await ids.allocate(key);
  console.log(`${key} → ID ${id} (isNew: ${isNew}, firstUse: ${firstUse})`);
}
const id = await ids.getNoCache("app=web;");
console.log(`the store maps app=web; to ${id}, and ${id} back to ${await ids.getById(id!)}`);
console.log(
  "release app=web; twice:",
  await ids.release("app=web;"),
  await ids.release("app=web;"),
);
