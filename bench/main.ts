/**
 * `deno task bench`: every benchmark, one table. etcd rows need `etcd` on PATH (skipped with a
 * note otherwise). `deno task bench kv` / `etcd` / `identity` / `telemetry` runs one group.
 *
 * @module
 */
import { benchAllocatorKv } from "./allocator_kv.ts";
import { benchEtcd } from "./etcd.ts";
import { benchIdentity } from "./identity.ts";
import { benchTelemetry } from "./telemetry.ts";
import type { BenchRow } from "./_table.ts";
import { etcdUnavailable } from "../tests/_support/etcd.ts";

const groups: Record<string, () => Promise<BenchRow[]>> = {
  kv: () => benchAllocatorKv(),
  etcd: () => {
    const why = etcdUnavailable();
    return why ? Promise.resolve([{ name: "etcd", value: `skipped: ${why}` }]) : benchEtcd();
  },
  identity: () => benchIdentity(),
  telemetry: () => benchTelemetry(),
};

const chosen = Deno.args.length > 0 ? Deno.args : Object.keys(groups);
const rows: BenchRow[] = [];
for (const name of chosen) {
  const group = groups[name];
  if (!group) {
    console.error(`unknown benchmark group '${name}' (have: ${Object.keys(groups).join(", ")})`);
    Deno.exit(1);
  }
  console.error(`running ${name}…`);
  rows.push(...await group());
}
console.log(`deno ${Deno.version.deno}, ${navigator.hardwareConcurrency} cores, ${Deno.build.os}`);
console.table(rows);
