/**
 * `deno task bench`: every benchmark, one table. `deno task bench deno-kv` / `etcd` / `inprocess` /
 * `identity` / `telemetry` runs one group; `--runs N` sets the cold runs per cell of the backend
 * groups.
 *
 * - one group per backend kind in the registry (`deno-kv`, `etcd`; `compare.ts`): the
 *   issue-level side-by-side table, each cell a cold process on a fresh store, raw ceiling next to
 *   idalloc, medians and p50/p99. A backend that cannot run here (etcd without `etcd` on PATH) is
 *   skipped with a note.
 * - `inprocess` (`allocator_kv.ts`): warm in-process rates on Deno KV, cached re-allocations.
 * - `identity` (`identity.ts`): the identity layer.
 * - `telemetry` (`telemetry.ts`): what OpenTelemetry costs, with no provider and with an SDK.
 * - `k8s-cilium` (`k8s_cilium.ts`): the Kubernetes backend beside Cilium v1.16's CRD-mode node on
 *   one private API server (skipped with a note where kube-apiserver or Cilium's node is not built).
 * - `scale` (`scale.ts`, only when named): a node starting into a full identity space.
 * - `k8s-scale` (`k8s_scale.ts`, only when named): many simulated Kubernetes nodes on one API
 *   server — joins, races beside Cilium's CRD nodes, GC — and how each figure grows with nodes;
 *   its own flags (`--nodes`, `--scenarios`, `--quick`, …) follow it.
 * - `k8s-memory` (`k8s_memory.ts`, only when named): the heap a Kubernetes session's index (and
 *   an allocator on it) keeps per identity at 10,000 and 100,000 identities (`--sizes`, `--real N`).
 * - `runtimes` (`runtimes.ts`, only when named): the Node.js example on Deno, Node.js and Bun.
 *
 * @module
 */
import { benchAllocatorKv } from "./allocator_kv.ts";
import { compare } from "./compare.ts";
import { benchIdentity } from "./identity.ts";
import { benchK8sCilium } from "./k8s_cilium.ts";
import { benchK8sMemory, MemoryBenchError, parseMemoryArgs } from "./k8s_memory.ts";
import { benchK8sScale } from "./k8s_scale.ts";
import { parseScaleArgs, SCALE_USAGE, ScaleUsageError } from "./k8s_scale_table.ts";
import { benchRuntimes } from "./runtimes.ts";
import { benchScale } from "./scale.ts";
import { benchTelemetry } from "./telemetry.ts";
import type { BenchRow } from "./_table.ts";
import { loadHarnesses } from "../src/testing/harness.ts";

const harnesses = await loadHarnesses();
const kinds = harnesses.map((h) => h.kind);
const column = Math.max(10, ...kinds.map((k) => k.length + 1));

const USAGE = `Usage: deno task bench [group…] [--runs N]

Runs the benchmarks and prints one table (progress on stderr). Without a group, every group.

Groups:
${
  kinds.map((k) =>
    `  ${k.padEnd(column)} cold processes on a fresh ${k} store: its raw ceiling next to idalloc ` +
    "(p50/p99)"
  ).join("\n")
}
  ${"inprocess".padEnd(column)} warm in-process rates on Deno KV, cached re-allocations
  ${"identity".padEnd(column)} the identity layer
  ${"telemetry".padEnd(column)} what OpenTelemetry costs, with no provider and with an SDK
  ${"k8s-cilium".padEnd(column)} the Kubernetes backend beside Cilium v1.16's CRD-mode node, one API
  ${"".padEnd(column)} server: new identities, joins, a fresh node's sync at 10,000 (where built)
  ${"scale".padEnd(column)} a node starting into 10,000 and 60,000 identities, per backend, beside
  ${"".padEnd(column)} Cilium's node where ../shared/cilium-node is built (not run by default)
  ${
  "k8s-scale".padEnd(column)
} many simulated Kubernetes nodes on one API server: joins, races beside
  ${"".padEnd(column)} Cilium's CRD nodes, GC; growth per node (not run by default; flags below)
  ${"k8s-memory".padEnd(column)} heap per identity of a Kubernetes session's index and allocator, at
  ${"".padEnd(column)} --sizes 10000,100000 (fed lists) and --real N (an API server; not by default)
  ${"runtimes".padEnd(column)} examples/node on Deno, Node.js and Bun side by side (IDALLOC_NODE,
  ${"".padEnd(column)} IDALLOC_BUN or PATH; not run by default)

A backend that cannot run here (etcd without etcd on PATH, k8s-cilium without kube-apiserver or
Cilium's node) is skipped with a note.

Options:
  --runs N   cold runs per cell of the backend groups (default 3)
  -h, --help this help

${SCALE_USAGE}`;

const args = [...Deno.args];
if (args.includes("--help") || args.includes("-h")) {
  console.log(USAGE);
  Deno.exit(0);
}
let scaleOptions;
let memoryOptions;
try {
  scaleOptions = parseScaleArgs(args);
  memoryOptions = parseMemoryArgs(args);
} catch (err) {
  if (!(err instanceof ScaleUsageError) && !(err instanceof MemoryBenchError)) throw err;
  console.error(err.message);
  Deno.exit(1);
}
const runsAt = args.indexOf("--runs");
const runs = runsAt === -1 ? 3 : Number(args.splice(runsAt, 2)[1]);
if (!Number.isSafeInteger(runs) || runs < 1) {
  console.error("--runs takes a whole number of runs per cell, at least 1");
  Deno.exit(1);
}

const groups: Record<string, () => Promise<BenchRow[]>> = {
  ...Object.fromEntries(harnesses.map((h) => [h.kind, () => {
    const why = h.unavailable();
    return why
      ? Promise.resolve([{ name: h.kind, value: `skipped: ${why}` }])
      : compare(h.kind, runs);
  }])),
  inprocess: () => benchAllocatorKv(),
  identity: () => benchIdentity(),
  telemetry: () => benchTelemetry(),
  "k8s-cilium": () => benchK8sCilium(runs),
  scale: () => benchScale(),
  "k8s-scale": () => benchK8sScale(scaleOptions),
  "k8s-memory": () => benchK8sMemory(memoryOptions),
  runtimes: () => benchRuntimes(runs),
};

// `scale` fills stores with 60,000 identities, `k8s-scale` runs hundreds of nodes, `k8s-memory`
// builds 100,000, `runtimes` needs Node.js and Bun: only when asked for.
const chosen = args.length > 0
  ? args
  : Object.keys(groups).filter((g) =>
    !["scale", "k8s-scale", "k8s-memory", "runtimes"].includes(g)
  );
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
