/**
 * `deno task bench scale`: a node starting into a full identity space, per backend. For each
 * backend of the registry: a fresh store is filled with identities (three labels each, at 64 in
 * flight, held by one filler node), then fresh processes (`scale_node.ts`) measure, at N = 10,000
 * and 60,000: the initial sync of the identity layer and of the plain allocator (time from opening,
 * peak RSS of the whole process), the memory per cached identity (peak RSS at 60,000 less at 2,000,
 * per identity), one GC pass over the 60,000 masters (all in use), and catch-up (a running node's
 * time until its cache has 10,000 identities that the filler creates, from 50,000 to 60,000), and
 * churn (a node with all of them cached allocates and releases 1,000 label sets of its own 20,000
 * times; its RSS should stay flat).
 *
 * Where a backend's harness names a Cilium peer (etcd) and `../shared/cilium-node/`'s node is built
 * on this machine (`$CILIUM_WORK/bin`, default `~/.cache/cilium-node/bin`), Cilium's figures are
 * measured in the same run beside ours; otherwise that column says why it is empty.
 *
 * @module
 */
import { IdentityAllocator, Labels } from "../src/identity/mod.ts";
import { loadHarnesses } from "../src/testing/harness.ts";
import type { BenchHooks } from "../src/testing/bench.ts";
import { ciliumBuild } from "./cilium.ts";
import { type BenchRow, fmt, median } from "./_table.ts";

const PREFIX = "cilium/state/identities/v1";
const RUNS = 3;
const SIZES = [10_000, 60_000];
const BASE = 2_000;
const CATCH_UP = 10_000;
/** Allocate/release cycles of the churn row. */
const CHURN_CYCLES = 20_000;
/** How long Cilium's catch-up node is given for its initial sync (it does not say when). */
const CILIUM_SYNC_WAIT_MS = 6_000;
const NODE = new URL("./scale_node.ts", import.meta.url).pathname;

/** The label set of identity number `i`, in Cilium's kvstore form. */
function labelsOf(i: number): string[] {
  return [
    `k8s:app=scale-${i}`,
    `k8s:io.kubernetes.pod.namespace=ns-${i % 100}`,
    "k8s:io.cilium.k8s.policy.cluster=default",
  ];
}

/** Cilium's allocator node, if built here: v1.13.10's (the issue's peer), else v1.16's. */
function ciliumBinary(): string | undefined {
  const build = ciliumBuild();
  return "why" in build ? undefined : build.nodes[0].bin;
}

export interface Measured {
  readonly lines: Record<string, number>[];
  /** Peak RSS of the whole process, MiB (`/usr/bin/time -v`). */
  readonly rssMiB: number;
  /** Wall time of the process, ms. */
  readonly wallMs: number;
}

/** Runs `cmd` under `/usr/bin/time -v`: its JSON lines, peak RSS and wall time. */
export async function measure(cmd: string, args: string[]): Promise<Measured> {
  const t = performance.now();
  const out = await new Deno.Command("/usr/bin/time", {
    args: ["-v", cmd, ...args],
    stdout: "piped",
    stderr: "piped",
  }).output();
  const wallMs = performance.now() - t;
  const stderr = new TextDecoder().decode(out.stderr);
  if (!out.success) throw new Error(`${cmd} failed (${out.code}): ${stderr.slice(-2000)}`);
  const rss = /Maximum resident set size \(kbytes\): (\d+)/.exec(stderr);
  const lines = new TextDecoder().decode(out.stdout).split("\n").filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l));
  return { lines, rssMiB: rss ? Number(rss[1]) / 1024 : NaN, wallMs };
}

/** A peer's figures (Cilium), or why there are none. */
type Peer = { readonly bin: string; readonly url: string } | { readonly why: string };

function oursNode(
  kind: string,
  where: unknown,
  layer: "identity" | "plain",
  task: string,
  expect?: number,
) {
  const spec = { kind, where, prefix: PREFIX, node: `fresh-${layer}-${task}`, layer, task, expect };
  // Churn samples what is retained: it collects garbage before each sample.
  const flags = task === "churn" ? ["--v8-flags=--expose-gc"] : [];
  return [
    Deno.execPath(),
    ["run", "-A", "--unstable-kv", ...flags, NODE, JSON.stringify(spec)],
  ] as const;
}

interface Figure {
  readonly ms: number;
  readonly rssMiB: number;
}

async function runs(times: number, once: () => Promise<Figure>): Promise<Figure> {
  const all: Figure[] = [];
  for (let i = 0; i < times; i++) all.push(await once());
  return { ms: median(all.map((f) => f.ms)), rssMiB: median(all.map((f) => f.rssMiB)) };
}

async function oursSync(
  kind: string,
  where: unknown,
  layer: "identity" | "plain",
): Promise<Figure> {
  return await runs(RUNS, async () => {
    const [cmd, args] = oursNode(kind, where, layer, "sync");
    const m = await measure(cmd, [...args]);
    return { ms: m.lines[0].ms, rssMiB: m.rssMiB };
  });
}

async function ciliumSync(peer: { bin: string; url: string }): Promise<Figure> {
  return await runs(RUNS, async () => {
    const m = await measure(peer.bin, ["-etcd", peer.url, "-prefix", PREFIX, "-node", "fresh-go"]);
    return { ms: m.lines[0].sync_ms, rssMiB: m.rssMiB };
  });
}

function cell(f: Figure | undefined, why?: string): string {
  return f ? `${fmt(f.ms)} ms, ${fmt(f.rssMiB)} MiB` : `— (${why})`;
}

function ratio(ours: Figure, theirs: Figure | undefined): string {
  if (!theirs) return "";
  return ` | time ${(ours.ms / theirs.ms).toFixed(2)}×, RSS ${
    (ours.rssMiB / theirs.rssMiB).toFixed(2)
  }× Cilium's`;
}

/** Fills the store up to `to` identities (held by `filler`) at 64 in flight; returns the rate. */
async function fill(filler: IdentityAllocator, from: number, to: number): Promise<number> {
  let next = from;
  const t = performance.now();
  await Promise.all(Array.from({ length: 64 }, async () => {
    while (next < to) await filler.allocate(Labels.parse(labelsOf(next++)));
  }));
  return (to - from) / ((performance.now() - t) / 1000);
}

/** Reads a child's stdout (or any stream) line by line as it comes: each JSON line, parsed. */
export async function* linesOf<T = Record<string, number>>(
  stream: ReadableStream<Uint8Array>,
): AsyncGenerator<T> {
  let buffer = "";
  for await (const chunk of stream.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let nl;
    while ((nl = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, nl);
      buffer = buffer.slice(nl + 1);
      if (line.startsWith("{")) yield JSON.parse(line);
    }
  }
}

/**
 * Catch-up: our node and (if any) Cilium's, both synced on `from` identities, watch the filler
 * create `CATCH_UP` more; each one's time from the start of that creation until its cache has
 * them all (the time its line arrives here).
 */
async function catchUp(
  kind: string,
  where: unknown,
  filler: IdentityAllocator,
  from: number,
  peer: Peer,
): Promise<{ ours: number; cilium?: number; rate: number }> {
  const [cmd, args] = oursNode(kind, where, "identity", "catchup", from + CATCH_UP);
  const ours = new Deno.Command(cmd, {
    args: [...args],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const oursLines = linesOf(ours.stdout);
  while (!(await oursLines.next()).value?.synced) { /* until synced */ }
  let cilium: Deno.ChildProcess | undefined;
  let ciliumLines: AsyncGenerator<Record<string, number>> | undefined;
  if ("bin" in peer) {
    const expect = await Deno.makeTempFile({ suffix: ".json" });
    const sets = Array.from({ length: CATCH_UP }, (_, i) => labelsOf(from + i));
    await Deno.writeTextFile(expect, JSON.stringify(sets));
    cilium = new Deno.Command(peer.bin, {
      args: [
        "-etcd",
        peer.url,
        "-prefix",
        PREFIX,
        "-node",
        "catchup-go",
        "-expect",
        expect,
        "-expect-timeout",
        "300s",
      ],
      stdout: "piped",
      stderr: "inherit",
    }).spawn();
    ciliumLines = linesOf(cilium.stdout);
    // Its one line comes only when it has them all (`-expect`): give it time to finish its
    // initial sync first (a fresh node's sync of this many took ~2.5 s here), so that the
    // creation starts after both nodes are synced.
    await new Promise((r) => setTimeout(r, CILIUM_SYNC_WAIT_MS));
  }
  const start = Date.now();
  const arrival = async (lines: AsyncGenerator<Record<string, number>> | undefined) => {
    if (!lines) return undefined;
    for await (const _ of lines) return Date.now() - start;
    return undefined;
  };
  const [rate, oursMs, ciliumMs] = await Promise.all([
    fill(filler, from, from + CATCH_UP),
    arrival(oursLines),
    arrival(ciliumLines),
  ]);
  await ours.status;
  await cilium?.status;
  return { ours: oursMs!, cilium: ciliumMs, rate };
}

async function scaleOf(
  kind: string,
  hooks: BenchHooks,
  bin: string | undefined,
): Promise<BenchRow[]> {
  await using store = await hooks.fresh();
  const url = hooks.ciliumPeer?.(store.where);
  const peer: Peer = !url
    ? { why: "no Cilium peer for this backend" }
    : bin
    ? { bin, url }
    : { why: "../shared/cilium-node not built here" };
  const rows: BenchRow[] = [];
  const row = (name: string, value: string) => {
    rows.push({ name: `scale ${kind}: ${name}`, value });
    console.error(`  ${name}: ${value}`);
  };
  await using backend = await hooks.open(store.where, PREFIX, "filler");
  await using filler = await IdentityAllocator.open(backend, { clusterId: 0 });
  const cilium = (f: () => Promise<Figure>) => "bin" in peer ? f() : Promise.resolve(undefined);

  let held = 0;
  const rate = await fill(filler, held, BASE);
  held = BASE;
  const base = {
    ours: await oursSync(kind, store.where, "identity"),
    cilium: await cilium(() => ciliumSync(peer as { bin: string; url: string })),
  };
  const fillRates = [rate];
  for (const n of SIZES) {
    if (n === 60_000) {
      fillRates.push(await fill(filler, held, n - CATCH_UP));
      const c = await catchUp(kind, store.where, filler, n - CATCH_UP, peer);
      fillRates.push(c.rate);
      row(
        `catch-up: a running node's cache gets ${fmt(CATCH_UP)} new identities (${
          fmt(n - CATCH_UP)
        } → ${fmt(n)})`,
        `${fmt(c.ours)} ms | Cilium ${
          c.cilium === undefined
            ? `— (${"why" in peer ? peer.why : "no answer"})`
            : `${fmt(c.cilium)} ms`
        }`,
      );
    } else {
      fillRates.push(await fill(filler, held, n));
    }
    held = n;
    for (const layer of ["identity", "plain"] as const) {
      const ours = await oursSync(kind, store.where, layer);
      const theirs = await cilium(() => ciliumSync(peer as { bin: string; url: string }));
      row(
        `N=${fmt(n)}: fresh node's initial sync, ${
          layer === "identity" ? "identity layer" : "plain allocator"
        }`,
        `${cell(ours)} | Cilium ${cell(theirs, "why" in peer ? peer.why : undefined)}${
          ratio(ours, theirs)
        }`,
      );
      if (layer === "identity" && n === 60_000) {
        const per = (f: Figure, b: Figure) => ((f.rssMiB - b.rssMiB) * 1024 * 1024) / (n - BASE);
        row(
          `memory per cached identity (peak RSS at ${fmt(n)} less at ${fmt(BASE)})`,
          `${fmt(per(ours, base.ours))} B | Cilium ${
            theirs && base.cilium ? `${fmt(per(theirs, base.cilium))} B` : "—"
          }`,
        );
      }
    }
  }
  // One GC pass over every master, all in use (the filler holds them).
  const gc = await runs(RUNS, async () => {
    const [cmd, args] = oursNode(kind, store.where, "plain", "gc");
    const m = await measure(cmd, [...args]);
    return { ms: m.lines[1].gcMs, rssMiB: m.rssMiB };
  });
  // Cilium's pass takes over a minute at 60,000: one run of it.
  const gcGo = await cilium(() =>
    runs(1, async () => {
      const p = peer as { bin: string; url: string };
      const m = await measure(p.bin, [
        "-etcd",
        p.url,
        "-prefix",
        PREFIX,
        "-node",
        "gc-go",
        "-gc",
        "1",
      ]);
      return { ms: m.wallMs, rssMiB: m.rssMiB };
    })
  );
  row(
    `one GC pass over ${fmt(held)} masters, all in use (ours: the pass; Cilium: its process)`,
    `${cell(gc)} | Cilium ${cell(gcGo, "why" in peer ? peer.why : undefined)}${
      gcGo
        ? ` | ${(gcGo.ms / gc.ms).toFixed(1)}× faster, RSS ${
          (gc.rssMiB / gcGo.rssMiB).toFixed(2)
        }× Cilium's`
        : ""
    }`,
  );
  // Churn beside the full space: a node with every identity cached allocates and releases
  // label sets of its own; its RSS should stay flat.
  {
    const [cmd, args] = oursNode(kind, store.where, "identity", "churn", CHURN_CYCLES);
    const m = await measure(cmd, [...args]);
    const { rssMiB, heapMiB } = m.lines[1] as unknown as { rssMiB: number[]; heapMiB: number[] };
    const span = (xs: number[]) => `${fmt(xs[1])} → ${fmt(xs[xs.length - 1])} MiB`;
    row(
      `churn at ${fmt(held)} cached: ${fmt(CHURN_CYCLES)} allocate/release cycles over 1,000 keys`,
      `after full collections, over the last 90%: RSS ${span(rssMiB)}, heap ${span(heapMiB)} ` +
        `(after sync: RSS ${fmt(rssMiB[0])}, heap ${fmt(heapMiB[0])} MiB)`,
    );
  }
  row(`fill rate (new identities at 64 in flight)`, fillRates.map((r) => `${fmt(r)}/s`).join(", "));
  return rows;
}

/** The scale group: every available backend of the registry. */
export async function benchScale(): Promise<BenchRow[]> {
  const bin = ciliumBinary();
  const rows: BenchRow[] = [];
  for (const harness of await loadHarnesses()) {
    const why = harness.unavailable();
    if (why) {
      rows.push({ name: `scale ${harness.kind}`, value: `skipped: ${why}` });
      continue;
    }
    console.error(`scale ${harness.kind}…`);
    rows.push(...await scaleOf(harness.kind, harness.bench, bin));
  }
  return rows;
}
