/**
 * `deno task bench`: every benchmark, one table. `deno task bench kv` / `etcd` / `inprocess` /
 * `identity` / `telemetry` runs one group; `--runs N` sets the cold runs per cell of the kv and etcd groups.
 *
 * - `kv`, `etcd` (`compare.ts`): the issue-level side-by-side table, each cell a cold process on a
 *   fresh store, raw ceiling next to idalloc, medians and p50/p99. etcd rows need `etcd` on PATH
 *   (skipped with a note otherwise).
 * - `inprocess` (`allocator_kv.ts`): warm in-process rates on Deno KV, cached re-allocations.
 * - `identity` (`identity.ts`): the identity layer.
 * - `telemetry` (`telemetry.ts`): what OpenTelemetry costs, with no provider and with an SDK.
 *
 * @module
 */
import { benchAllocatorKv } from "./allocator_kv.ts";
import { compare } from "./compare.ts";
import { benchIdentity } from "./identity.ts";
import { benchTelemetry } from "./telemetry.ts";
import type { BenchRow } from "./_table.ts";
import { etcdUnavailable } from "../tests/_support/etcd.ts";

const USAGE = `Usage: deno task bench [group…] [--runs N]

Runs the benchmarks and prints one table (progress on stderr). Without a group, every group.

Groups:
  kv         cold processes on a fresh Deno KV file: raw Deno KV next to idalloc (p50/p99)
  etcd       the same on a private etcd on loopback (needs etcd on PATH; skipped otherwise)
  inprocess  warm in-process rates on Deno KV, cached re-allocations
  identity   the identity layer
  telemetry  what OpenTelemetry costs, with no provider and with an SDK

Options:
  --runs N   cold runs per cell of the kv and etcd groups (default 3)
  -h, --help this help`;

const args = [...Deno.args];
if (args.includes("--help") || args.includes("-h")) {
  console.log(USAGE);
  Deno.exit(0);
}
const runsAt = args.indexOf("--runs");
const runs = runsAt === -1 ? 3 : Number(args.splice(runsAt, 2)[1]);
if (!Number.isSafeInteger(runs) || runs < 1) {
  console.error("--runs takes a whole number of runs per cell, at least 1");
  Deno.exit(1);
}

const groups: Record<string, () => Promise<BenchRow[]>> = {
  kv: () => compare("kv", runs),
  etcd: () => {
    const why = etcdUnavailable();
    return why
      ? Promise.resolve([{ name: "etcd", value: `skipped: ${why}` }])
      : compare("etcd", runs);
  },
  inprocess: () => benchAllocatorKv(),
  identity: () => benchIdentity(),
  telemetry: () => benchTelemetry(),
};

const chosen = args.length > 0 ? args : Object.keys(groups);
const rows: BenchRow[] = [];
for (const name of chosen) {
  const group = groups[name];
  if (!group) {
    const what = name.startsWith("-")
      ? `unknown option '${name}'`
      : `unknown benchmark group '${name}'`;
    console.error(`${what} (groups: ${Object.keys(groups).join(", ")}; see --help)`);
    Deno.exit(1);
  }
  console.error(`running ${name}…`);
  rows.push(...await group());
}
console.log(`deno ${Deno.version.deno}, ${navigator.hardwareConcurrency} cores, ${Deno.build.os}`);
const width = Math.max(...rows.map((r) => r.name.length));
for (const row of rows) console.log(`${row.name.padEnd(width)}  ${row.value}`);
