/**
 * The side-by-side table of issue-level figures: for each backend, the raw one-commit-per-key
 * ceiling on the same client next to idalloc's new keys, joins and releases, sequential and 16 in
 * flight, with group commit off and (etcd) without the Cilium-mutex guard for comparison, and 4
 * processes racing on 500 keys. Every measurement runs in a cold process (`bench/scenario.ts`) on a
 * fresh store (a new KV file; a new private etcd), and is repeated: the table shows medians, the
 * range, p50/p99 latency per operation, and the rate of the first 1,000 operations (warm-up).
 *
 * `deno task bench deno-kv etcd [--runs N]` (see `bench/main.ts`)
 *
 * @module
 */
import { loadHarness } from "../src/backends/testing.ts";
import { type BenchRow, fmt } from "./_table.ts";
import type { BenchCell, BenchHooks } from "./backend.ts";
import type { ScenarioResult, ScenarioSpec } from "./scenario.ts";

const SCENARIO = new URL("./scenario.ts", import.meta.url).pathname;
const ROOT = new URL("../", import.meta.url).pathname;

const SEQ = 1_000;
const PAR = 3_000;
const RACERS = 4;
const RACE_KEYS = 500;

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

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/** The race: `RACERS` cold processes allocate the same keys at once; wall time, IDs agree. */
async function race(
  store: string,
  bench: BenchHooks,
): Promise<{ wall: number; agreed: boolean }> {
  await using fresh = await bench.fresh();
  const startAt = Date.now() + 3_000;
  const results = await Promise.all(
    Array.from({ length: RACERS }, (_, n) =>
      child({
        store,
        where: fresh.where,
        scenario: "race",
        count: RACE_KEYS,
        width: RACE_KEYS,
        startAt,
        node: `racer-${n}`,
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

/**
 * Runs every cell of `store` `runs` times, round-robin (each round runs every cell once, so a
 * drift of the machine hits every cell alike); one table row per cell.
 */
export async function compare(store: string, runs = 3): Promise<BenchRow[]> {
  const { bench } = await loadHarness(store);
  const rows: BenchRow[] = [];
  const medians = new Map<string, number>();
  const all = cells(bench);
  const results = new Map<string, ScenarioResult[]>(all.map((c) => [c.name, []]));
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
  }
  for (const cell of all) {
    const measured = results.get(cell.name)!;
    const rates = measured.map((x) => x.rate);
    const rate = median(rates);
    medians.set(cell.name, rate);
    const raw = cell.versus ? medians.get(cell.versus) : undefined;
    rows.push({
      name: `${store} ${cell.name}`,
      value: `${fmt(rate)}/s [${fmt(Math.min(...rates))}–${fmt(Math.max(...rates))}]` +
        (raw ? ` ${(rate / raw).toFixed(2)}× raw` : "") +
        `; p50 ${median(measured.map((x) => x.p50)).toFixed(2)} ms` +
        `, p99 ${median(measured.map((x) => x.p99)).toFixed(2)} ms` +
        `; first 1,000: ${fmt(median(measured.map((x) => x.firstRate)))}/s`,
    });
  }
  const walls: number[] = [];
  let agreed = true;
  for (let r = 0; r < runs; r++) {
    const one = await race(store, bench);
    walls.push(one.wall);
    agreed &&= one.agreed;
  }
  rows.push({
    name: `${store} ${RACERS} processes racing on ${RACE_KEYS} keys (wall)`,
    value: `${(median(walls) * 1000).toFixed(0)} ms [${(Math.min(...walls) * 1000).toFixed(0)}–` +
      `${(Math.max(...walls) * 1000).toFixed(0)}]` + (agreed ? ", IDs identical" : ", IDs DIFFER"),
  });
  return rows;
}
