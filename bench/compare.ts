/**
 * The side-by-side table of issue-level figures: for each backend, the raw one-commit-per-key
 * ceiling on the same client next to idalloc's new keys, joins, releases and cached
 * re-allocations, sequential and 16 in flight, with group commit off and (etcd) without the
 * Cilium-mutex guard for comparison, and 4 processes racing on 500 keys in both shapes (all keys
 * at once; each process one key at a time in its own shuffled order). Every measurement runs in a
 * process of its own (`bench/scenario.ts`) on a fresh store (a new KV file; a new private etcd),
 * warm (an untimed warm-up of 300 keys first), and is repeated round-robin: the table shows
 * medians, the range, p50/p99 latency per operation, and the rate of the first 1,000 operations.
 *
 * Where the backend has a Cilium peer (etcd) and `../shared/cilium-node/` is built here, the same
 * run measures etcd's Go client's raw ceiling and real Cilium nodes (v1.13.10, v1.16) on the same
 * workloads (`bench/cilium.ts`), and our rows show the ratios.
 *
 * `deno task bench deno-kv etcd [--runs N]` (see `bench/main.ts`)
 *
 * @module
 */
import { loadHarness } from "../src/testing/harness.ts";
import { type BenchRow, fmt, median, msSpread, rateSpread } from "./_table.ts";
import type { BenchCell, BenchHooks } from "../src/testing/bench.ts";
import type { ScenarioResult, ScenarioSpec } from "./scenario.ts";
import {
  ciliumBuild,
  type CiliumNode,
  ciliumRace,
  ciliumRate,
  type CiliumWorkload,
  goCeiling,
  labelFile,
} from "./cilium.ts";

const SCENARIO = new URL("./scenario.ts", import.meta.url).pathname;
const ROOT = new URL("../", import.meta.url).pathname;

const SEQ = 1_000;
const PAR = 3_000;
const RACERS = 4;
const RACE_KEYS = 500;
/** Cached re-allocations per measurement (100 rounds over 1,000 held keys). */
const REALLOC = 100_000;

/** The table's cells for a backend: the common ones, and its own after the new-key cells. */
function cells(bench: BenchHooks): BenchCell[] {
  const list: BenchCell[] = [
    { name: "raw, sequential", scenario: "raw", count: SEQ, width: 1 },
    { name: "raw, 16 in flight", scenario: "raw", count: PAR, width: 16 },
    {
      name: "new keys, sequential",
      scenario: "new",
      count: SEQ,
      width: 1,
      versus: "raw, sequential",
    },
    {
      name: "new keys, 16 in flight",
      scenario: "new",
      count: PAR,
      width: 16,
      versus: "raw, 16 in flight",
    },
    {
      name: "new keys, 16 in flight, group commit off",
      scenario: "new",
      count: PAR,
      width: 16,
      options: { groupCommit: false },
      versus: "raw, 16 in flight",
    },
    {
      name: "join by a 2nd node, sequential",
      scenario: "join",
      count: SEQ,
      width: 1,
      versus: "raw, sequential",
    },
    {
      name: "join by a 2nd node, 16 in flight",
      scenario: "join",
      count: PAR,
      width: 16,
      versus: "raw, 16 in flight",
    },
    { name: "final release, sequential", scenario: "release", count: SEQ, width: 1 },
    { name: "final release, 16 in flight", scenario: "release", count: PAR, width: 16 },
    {
      name: "final release, sequential, write-behind",
      scenario: "release",
      count: SEQ,
      width: 1,
      options: { releaseInBackground: true },
    },
    {
      name: "final release, 16 in flight, write-behind",
      scenario: "release",
      count: PAR,
      width: 16,
      options: { releaseInBackground: true },
    },
    { name: "cached re-allocation, sequential", scenario: "realloc", count: REALLOC, width: 1 },
  ];
  const newKeys = list.findIndex((c) => c.scenario === "new" && c.options?.groupCommit === false);
  list.splice(newKeys + 1, 0, ...bench.extraCells({ sequential: SEQ, parallel: PAR }));
  return list;
}

async function child(spec: ScenarioSpec): Promise<ScenarioResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", SCENARIO, JSON.stringify(spec)],
    cwd: ROOT,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder().decode(out.stdout).trim();
  if (!out.success || text === "") {
    throw new Error(`bench child failed: ${new TextDecoder().decode(out.stderr)}`);
  }
  return JSON.parse(text.split("\n").at(-1)!);
}

/** The two shapes of the race. */
const RACES = [
  { name: "all keys at once", width: RACE_KEYS, shuffle: false },
  { name: "each one key at a time, shuffled", width: 1, shuffle: true },
] as const;

/**
 * The race: `RACERS` processes allocate the same keys, starting together after their warm-ups;
 * wall time from the first start to the last end, and whether the IDs agree.
 */
async function race(
  store: string,
  bench: BenchHooks,
  shape: (typeof RACES)[number],
): Promise<{ wall: number; agreed: boolean }> {
  await using fresh = await bench.fresh();
  const startAt = Date.now() + 4_000;
  const results = await Promise.all(
    Array.from({ length: RACERS }, (_, n) =>
      child({
        store,
        where: fresh.where,
        scenario: "race",
        count: RACE_KEYS,
        width: shape.width,
        startAt,
        node: `racer-${n}`,
        order: shape.shuffle ? n + 1 : undefined,
      })),
  );
  const wall = Math.max(...results.map((r) => r.seconds));
  // Key by key: each racer filled its map in the order its calls completed.
  const [first, ...rest] = results.map((r) => r.ids ?? {});
  const agreed = rest.every((ids) =>
    Object.keys(first).length === RACE_KEYS &&
    Object.entries(first).every(([key, id]) => ids[key] === id)
  );
  return { wall, agreed };
}

/** A figure of the peer programs (`bench/cilium.ts`), measured on a fresh store's address. */
interface PeerCell {
  readonly name: string;
  /** Operations per second, or (race) seconds. */
  measure(url: string): Promise<number>;
}

/** The Go ceiling's and Cilium's cells, where built; else why there are none. */
async function peerCells(files: string[]): Promise<PeerCell[] | string> {
  const build = ciliumBuild();
  if ("why" in build) return build.why;
  const cells: PeerCell[] = [];
  if (build.ceiling) {
    const bin = build.ceiling;
    cells.push(
      { name: "raw Go, sequential", measure: (url) => goCeiling(bin, url, SEQ, 1) },
      { name: "raw Go, 16 in flight", measure: (url) => goCeiling(bin, url, PAR, 16) },
    );
  }
  const labels: Record<number, string> = {
    [SEQ]: await labelFile(SEQ),
    [PAR]: await labelFile(PAR),
  };
  const race = await labelFile(RACE_KEYS);
  files.push(...Object.values(labels), race);
  const rate =
    (node: CiliumNode, w: CiliumWorkload, count: number, width: number) => (url: string) =>
      ciliumRate(node, url, w, labels[count], width);
  for (const node of build.nodes) {
    const c = `Cilium ${node.version}`;
    cells.push(
      { name: `${c} new keys, sequential`, measure: rate(node, "new", SEQ, 1) },
      { name: `${c} new keys, 16 in flight`, measure: rate(node, "new", PAR, 16) },
      { name: `${c} join, sequential`, measure: rate(node, "join", SEQ, 1) },
      { name: `${c} final release, sequential`, measure: rate(node, "release", SEQ, 1) },
      { name: `${c} cached re-allocation`, measure: rate(node, "realloc", SEQ, 16) },
      {
        name: `${c} race, ${RACES[1].name}`,
        measure: async (url) => {
          const r = await ciliumRace(node, url, race, RACERS);
          if (!r.agreed) throw new Error(`${c}'s racers disagree on IDs`);
          return r.seconds;
        },
      },
    );
  }
  return cells;
}

/** Which peer figures an idalloc cell is compared with: the Go ceiling's and Cilium's. */
function peersOf(cell: BenchCell): { raw?: string; cilium?: string } {
  const width = cell.width === 1 ? "sequential" : "16 in flight";
  const cilium: Partial<Record<BenchCell["scenario"], string>> = {
    new: `new keys, ${width}`,
    join: cell.width === 1 ? "join, sequential" : undefined,
    release: cell.width === 1 ? "final release, sequential" : undefined,
    realloc: "cached re-allocation",
  };
  return {
    raw: cell.scenario === "new" || cell.scenario === "join" ? `raw Go, ${width}` : undefined,
    cilium: cilium[cell.scenario],
  };
}

/**
 * Runs every cell of `store` `runs` times, round-robin (each round runs every cell once, so a
 * drift of the machine hits every cell alike); one table row per cell.
 */
export async function compare(store: string, runs = 3): Promise<BenchRow[]> {
  const { bench } = await loadHarness(store);
  const rows: BenchRow[] = [];
  const medians = new Map<string, number>();
  const all = cells(bench);
  const files: string[] = [];
  const peers = bench.ciliumPeer ? await peerCells(files) : "no Cilium peer for this backend";
  const results = new Map<string, ScenarioResult[]>(all.map((c) => [c.name, []]));
  const peerResults = new Map<string, number[]>();
  const walls = new Map<string, number[]>(RACES.map((r) => [r.name, []]));
  let agreed = true;
  for (let r = 0; r < runs; r++) {
    for (const cell of all) {
      await using fresh = await bench.fresh();
      results.get(cell.name)!.push(
        await child({
          store,
          where: fresh.where,
          scenario: cell.scenario,
          count: cell.count,
          width: cell.width,
          options: cell.options,
        }),
      );
    }
    for (const shape of RACES) {
      const one = await race(store, bench, shape);
      walls.get(shape.name)!.push(one.wall);
      agreed &&= one.agreed;
    }
    if (typeof peers === "string") continue;
    for (const peer of peers) {
      await using fresh = await bench.fresh();
      const figures = peerResults.get(peer.name) ?? [];
      figures.push(await peer.measure(bench.ciliumPeer!(fresh.where)));
      peerResults.set(peer.name, figures);
    }
  }
  const peerMedian = (name: string | undefined) => {
    if (name === undefined || typeof peers === "string") return [];
    return [...peerResults].filter(([n]) => n === name || n.endsWith(` ${name}`))
      .map(([n, xs]) => ({ name: n, value: median(xs) }));
  };
  for (const cell of all) {
    const measured = results.get(cell.name)!;
    const rates = measured.map((x) => x.rate);
    const rate = median(rates);
    medians.set(cell.name, rate);
    const raw = cell.versus ? medians.get(cell.versus) : undefined;
    const { raw: goRaw, cilium } = peersOf(cell);
    const landed = measured.every((x) =>
        x.landed !== undefined
      ) && cell.options?.releaseInBackground
      ? `; all landed: ${fmt(median(measured.map((x) => x.landed!)))}/s`
      : "";
    const ratios = [
      ...peerMedian(goRaw).map((p) => `${(rate / p.value).toFixed(2)}× raw Go`),
      ...peerMedian(cilium).map((p) =>
        `${(rate / p.value).toFixed(2)}× ${p.name.split(" ").slice(0, 2).join(" ")}`
      ),
    ];
    rows.push({
      name: `${store} ${cell.name}`,
      value: rateSpread(rates) +
        (raw ? ` ${(rate / raw).toFixed(2)}× raw` : "") +
        (ratios.length ? ` (${ratios.join(", ")})` : "") + landed +
        `; p50 ${median(measured.map((x) => x.p50)).toFixed(2)} ms` +
        `, p99 ${median(measured.map((x) => x.p99)).toFixed(2)} ms` +
        `; first 1,000: ${fmt(median(measured.map((x) => x.firstRate)))}/s`,
    });
  }
  for (const shape of RACES) {
    const w = walls.get(shape.name)!;
    const cilium = shape.width === 1 ? peerMedian(`race, ${shape.name}`) : [];
    rows.push({
      name: `${store} race: ${RACERS} processes on ${RACE_KEYS} keys, ${shape.name} (wall)`,
      value: msSpread(w) + (agreed ? ", IDs identical" : ", IDs DIFFER") +
        cilium.map((p) =>
          `; ${(median(w) / p.value).toFixed(2)} of ${
            p.name.split(" ").slice(0, 2).join(" ")
          }'s time`
        ).join(""),
    });
  }
  for (const file of files) await Deno.remove(file);
  if (typeof peers === "string") {
    rows.push({ name: `${store} Go ceiling and Cilium`, value: `skipped: ${peers}` });
  } else {
    for (const [name, xs] of peerResults) {
      rows.push({
        name: `${store} ${name}`,
        value: name.includes(" race, ") ? msSpread(xs) : rateSpread(xs),
      });
    }
  }
  return rows;
}
