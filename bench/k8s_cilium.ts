/**
 * `deno task bench k8s-cilium`: the Kubernetes backend beside Cilium v1.16's own CRD-mode node
 * (`interop116 -kubeconfig`, `../shared/cilium-node/`) in the same run, on one private API server
 * (etcd + kube-apiserver v1.20, the dev-only launcher) with Cilium's own CRDs. Each figure is a
 * fresh process per side per run (ours: `k8s_cilium_node.ts`, opening the backend through its
 * public entry and a kubeconfig), measured inside the process as Cilium's node measures itself,
 * after an untimed warm-up of 100 keys, round-robin over `--runs`:
 *
 * - new identities per second, sequential (200 label sets) and 16 in flight (1,000);
 * - joins per second, 16 in flight: a second node allocates 1,000 label sets a first node of the
 *   same side created and holds (Cilium's CRD mode writes nothing to join — it keeps no
 *   reference — idalloc writes its reference annotation);
 * - a fresh node's initial sync (connect, list, cache) with 10,000 identities in the store, and
 *   the process's peak RSS (`/usr/bin/time -v`).
 *
 * Where kube-apiserver or Cilium's node is not built, the group is one row saying why.
 *
 * @module
 */
import { spawn } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Allocator } from "../mod.ts";
import { K8sBackend } from "../src/backends/k8s/mod.ts";
import {
  type CiliumCrdNode,
  ciliumCrdNode,
  CiliumProcess,
  startCiliumCluster,
} from "../src/backends/k8s/testing/cilium.ts";
import { findKubeApiserver } from "../src/backends/k8s/testing/cluster.ts";
import { Labels } from "../src/identity/mod.ts";
import type { BenchNodeConfig } from "./k8s_cilium_node.ts";
import { measure, type Measured } from "./scale.ts";
import { type BenchRow, fmt, median, msSpread, rateSpread } from "./_table.ts";

const NODE = new URL("./k8s_cilium_node.ts", import.meta.url).pathname;
const ROOT = new URL("../", import.meta.url).pathname;
const SEQ = 200;
const PAR = 1_000;
const JOIN = 1_000;
const FILL = 10_000;
const WARM = 100;

/** A rate cell: label sets, calls in flight, and whether a first node creates them beforehand. */
interface RateCell {
  readonly name: string;
  readonly count: number;
  readonly width: number;
  readonly join: boolean;
}

const CELLS: readonly RateCell[] = [
  { name: `new identities, sequential (${fmt(SEQ)})`, count: SEQ, width: 1, join: false },
  { name: `new identities, 16 in flight (${fmt(PAR)})`, count: PAR, width: 16, join: false },
  { name: `join by a 2nd node, 16 in flight (${fmt(JOIN)})`, count: JOIN, width: 16, join: true },
];

/** The label set of identity `i` of a run's cell (three labels, as `scale.ts`'s). */
function labelsOf(tag: string, i: number): string[] {
  return [
    `k8s:app=${tag}-${i}`,
    `k8s:io.kubernetes.pod.namespace=ns-${i % 100}`,
    "k8s:io.cilium.k8s.policy.cluster=default",
  ];
}

/** Why the group cannot run here, or the Cilium node. */
function available(): CiliumCrdNode | string {
  if (findKubeApiserver() === undefined) {
    return "kube-apiserver is not built (../shared/kube-apiserver/build.sh)";
  }
  const node = ciliumCrdNode();
  return "bin" in node ? node : node.why;
}

/** The world of one bench run: the server, a kubeconfig, a dir for label files. */
interface World {
  readonly cilium: CiliumCrdNode;
  readonly kubeconfig: string;
  labels(tag: string, count: number): Promise<string>;
}

/** Our node's process (`k8s_cilium_node.ts`) with `config`, measured. */
function ours(
  w: World,
  config: Omit<BenchNodeConfig, "kubeconfig" | "context">,
): Promise<Measured> {
  const full: BenchNodeConfig = { kubeconfig: w.kubeconfig, context: "test", ...config };
  return measure(Deno.execPath(), ["run", "-A", NODE, JSON.stringify(full)]);
}

/** Cilium's node with `args` (after the kubeconfig), measured. */
function theirs(w: World, args: readonly string[]): Promise<Measured> {
  return measure(w.cilium.bin, ["-kubeconfig", w.kubeconfig, "-no-mapping", ...args]);
}

/** One rate cell of run `run` on both sides: new identities (or joins) per second each. */
async function rates(w: World, cell: RateCell, run: number): Promise<[number, number]> {
  const perSecond = (line: Record<string, number>) => line.allocated / (line.alloc_ms / 1000);
  const tag = (side: string) => `${side}-${cell.width}-${cell.join ? "join" : "new"}-${run}`;
  const ourLabels = await w.labels(tag("i"), cell.count);
  const width = { width: cell.width, warm: WARM };
  let idalloc: number;
  if (cell.join) {
    await using _first = await holdingNode(w, tag("i"), ourLabels);
    idalloc = perSecond(
      (await ours(w, { node: `${tag("i")}-b`, labels: ourLabels, ...width }))
        .lines[1],
    );
  } else {
    idalloc = perSecond((await ours(w, { node: tag("i"), labels: ourLabels, ...width })).lines[1]);
  }
  const theirLabels = await w.labels(tag("c"), cell.count);
  const args = ["-labels", theirLabels, "-concurrency", String(cell.width), "-warm", String(WARM)];
  let cilium: number;
  if (cell.join) {
    await using first = new CiliumProcess(w.cilium, [
      ...["-kubeconfig", w.kubeconfig, "-node", `${tag("c")}-a`, "-labels", theirLabels],
      ...["-concurrency", "16", "-hold", "-no-mapping"],
    ]);
    await first.line();
    cilium = perSecond((await theirs(w, ["-node", `${tag("c")}-b`, ...args])).lines[0]);
    await first.stop();
  } else {
    cilium = perSecond((await theirs(w, ["-node", tag("c"), ...args])).lines[0]);
  }
  return [idalloc, cilium];
}

/** Our node creating and holding `labels` until disposed (the join cell's first node). */
async function holdingNode(w: World, tag: string, labels: string): Promise<AsyncDisposable> {
  const config: BenchNodeConfig = {
    kubeconfig: w.kubeconfig,
    context: "test",
    node: `${tag}-a`,
    labels,
    width: 16,
    hold: true,
  };
  const child = spawn(Deno.execPath(), ["run", "-A", NODE, JSON.stringify(config)], {
    cwd: ROOT,
    stdio: ["pipe", "pipe", "inherit"],
  });
  const exited = new Promise((resolve) => child.once("close", resolve));
  let out = "";
  child.stdout!.setEncoding("utf8");
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on("data", (chunk: string) => {
      out += chunk;
      if (out.split("\n").filter((l) => l.startsWith("{")).length >= 2) resolve();
    });
    child.once("close", () => reject(new Error(`the holding node ended: ${out}`)));
  });
  return {
    async [Symbol.asyncDispose]() {
      child.stdin!.end();
      await exited;
    },
  };
}

/**
 * Fills the store with `count` identities through an idalloc node, 32 in flight; the rate. Each is
 * released once created: one node's reference object holds about 11,200 references (`refs.ts`), and
 * a released identity stays in the store (nothing runs GC here), which is what the sync measures.
 */
async function fill(kubeconfig: string, count: number): Promise<number> {
  await using backend = await K8sBackend.connect({ node: "filler", kubeconfig, context: "test" });
  await using alloc = await Allocator.open(backend, { min: 256, max: 65535 });
  let next = 0;
  const t = performance.now();
  await Promise.all(Array.from({ length: 32 }, async () => {
    while (next < count) {
      const key = Labels.parse(labelsOf("fill", next++)).toKvstoreString();
      await alloc.allocate(key);
      await alloc.release(key);
    }
  }));
  return count / ((performance.now() - t) / 1000);
}

/** The group's rows (see the module doc). */
export async function benchK8sCilium(runs = 3): Promise<BenchRow[]> {
  const node = available();
  if (typeof node === "string") return [{ name: "k8s-cilium", value: `skipped: ${node}` }];
  await using cluster = await startCiliumCluster(node);
  const dir = await mkdtemp(join(tmpdir(), "idalloc-bench-k8s-"));
  try {
    const w: World = {
      cilium: node,
      kubeconfig: await cluster.kubeconfig("admin", { context: "test", namespace: "default" }),
      async labels(tag, count) {
        const path = join(dir, `${tag}.json`);
        const sets = Array.from({ length: count }, (_, i) => labelsOf(tag, i));
        await writeFile(path, JSON.stringify(sets));
        return path;
      },
    };
    const rows: BenchRow[] = [];
    const row = (name: string, value: string) => {
      rows.push({ name: `k8s-cilium ${name}`, value });
      console.error(`  ${name}: ${value}`);
    };
    const fillRate = await fill(w.kubeconfig, FILL);
    const sync = { idalloc: [] as Measured[], cilium: [] as Measured[] };
    for (let run = 0; run < runs; run++) {
      sync.idalloc.push(await ours(w, { node: `sync-i-${run}` }));
      sync.cilium.push(await theirs(w, ["-node", `sync-c-${run}`]));
    }
    const seconds = (xs: Measured[]) => xs.map((m) => m.lines[0].sync_ms / 1000);
    const rss = (xs: Measured[]) => fmt(median(xs.map((m) => m.rssMiB)));
    const [si, sc] = [seconds(sync.idalloc), seconds(sync.cilium)];
    row(
      `fresh node's initial sync, ${fmt(FILL)} identities (peak RSS)`,
      `idalloc ${msSpread(si)}, ${rss(sync.idalloc)} MiB | Cilium CRD ${msSpread(sc)}, ${
        rss(sync.cilium)
      } MiB | time ${(median(si) / median(sc)).toFixed(2)}× Cilium's`,
    );
    const measured = new Map<string, [number[], number[]]>(CELLS.map((c) => [c.name, [[], []]]));
    for (let run = 0; run < runs; run++) {
      for (const cell of CELLS) {
        const [i, c] = await rates(w, cell, run);
        measured.get(cell.name)![0].push(i);
        measured.get(cell.name)![1].push(c);
      }
    }
    for (const cell of CELLS) {
      const [i, c] = measured.get(cell.name)!;
      // Cilium's CRD mode keeps no reference: its join is a lookup in its cache, no write.
      const versus = cell.join
        ? "Cilium writes nothing to join, idalloc one patch"
        : `${(median(i) / median(c)).toFixed(2)}× Cilium`;
      row(cell.name, `idalloc ${rateSpread(i)} | Cilium CRD ${rateSpread(c)} | ${versus}`);
    }
    row(
      "setup",
      `one kube-apiserver v1.20 + etcd on this machine; Cilium's client at 10,000 QPS ` +
        `(interop116's default, above cilium-agent's); ${fmt(FILL)} identities filled by one ` +
        `idalloc node at 32 in flight: ${fmt(fillRate)}/s`,
    );
    return rows;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
