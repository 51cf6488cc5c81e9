/**
 * The growth run: one allocator doing allocate/release cycles over 1,000 keys (GC every second),
 * sampled every tenth of the run. Nothing may grow with the number of cycles: masters and key
 * state stay within the key set, references within the held window, dead references and lease
 * records near zero, the change feed within what its retention allows, memory and the KV file
 * within a margin of their size after warm-up.
 *
 * @module
 */
import type { Sink } from "../src/cli/io.ts";
import { writeTable } from "../src/cli/table.ts";
import { hooksOf } from "./backends.ts";
import { Child } from "./child.ts";
import type { Violation } from "./checks/violation.ts";
import { TIMINGS } from "./config.ts";
import type { GrowthSample } from "../src/testing/nemesis.ts";
import type { GrowthConfig } from "./growth_worker.ts";

/** Check name of the growth bounds. */
export const GROWTH_CHECK = "growth stays bounded";

const KEYS = 1_000;
const WINDOW = 50;
const MiB = 1024 * 1024;

/** What the growth run measured and which bounds it broke. */
export interface GrowthReport {
  /** The backend's kind. */
  readonly backend: string;
  readonly cycles: number;
  readonly samples: readonly GrowthSample[];
  readonly violations: readonly Violation[];
  readonly durationMs: number;
}

/** Runs `cycles` allocate/release cycles on a fresh store of `backend`; files go under `dir`. */
export async function runGrowth(
  backend: string,
  cycles: number,
  dir: string,
): Promise<GrowthReport> {
  const started = Date.now();
  await Deno.mkdir(dir, { recursive: true });
  await using store = await hooksOf(backend).startGrowth(dir);
  const config: GrowthConfig = {
    store: store.spec,
    cycles,
    sampleEvery: Math.max(1, Math.round(cycles / 10)),
    keys: KEYS,
    window: WINDOW,
    logRetentionMs: 5_000,
    timings: TIMINGS,
    samplesPath: `${dir}/samples.jsonl`,
    seed: 1,
  };
  await using child = await Child.spawn(
    `growth-${backend}`,
    "nemesis/growth_worker.ts",
    config,
    `${dir}/growth.stderr`,
    ["--expose-gc"],
  );
  const violations: Violation[] = [];
  try {
    await child.waitFor("done", 120_000 + cycles * 20);
  } catch (err) {
    violations.push({ check: GROWTH_CHECK, message: `the growth run did not finish: ${err}` });
  }
  const samples: GrowthSample[] = (await Deno.readTextFile(config.samplesPath).catch(() => ""))
    .split("\n").filter((l) => l.trim() !== "").map((l) => JSON.parse(l));
  violations.push(...checkGrowth(backend, samples));
  return { backend, cycles, samples, violations, durationMs: Date.now() - started };
}

/**
 * The bounds, per sample: the key set bounds masters, and the backend's own bounds (its harness's
 * `growth.check`: key state, references within the window, lease records, the change feed);
 * after warm-up (the second sample) heap and RSS grow by at most a fixed margin, and so do the
 * store's files.
 */
export function checkGrowth(backend: string, samples: readonly GrowthSample[]): Violation[] {
  const hooks = hooksOf(backend);
  const out: Violation[] = [];
  const fail = (s: GrowthSample, what: string) =>
    out.push({ check: GROWTH_CHECK, message: `after ${s.cycles} cycles: ${what}`, evidence: s });
  for (const s of samples) {
    const masters = s.counts["id"] ?? 0;
    if (masters > KEYS) fail(s, `${masters} masters for ${KEYS} keys`);
    hooks.growth.check(s, { keys: KEYS, window: WINDOW }, (what) => fail(s, what));
  }
  const warm = samples[1];
  const last = samples[samples.length - 1];
  if (warm && last && last !== warm) {
    const heapLimit = warm.heapUsed * 1.25 + 8 * MiB;
    if (last.heapUsed > heapLimit) {
      fail(
        last,
        `heap ${mib(last.heapUsed)} MiB, over ${mib(heapLimit)} MiB (warm-up ${
          mib(warm.heapUsed)
        } MiB)`,
      );
    }
    const rssLimit = warm.rss * 1.5 + 48 * MiB;
    if (last.rss > rssLimit) fail(last, `RSS ${mib(last.rss)} MiB, over ${mib(rssLimit)} MiB`);
    // A store without files reports 0 bytes, which stays under any limit.
    const fileLimit = warm.fileBytes * 2 + 32 * MiB;
    if (last.fileBytes > fileLimit) {
      fail(last, `store file ${mib(last.fileBytes)} MiB, over ${mib(fileLimit)} MiB`);
    }
  }
  return out;
}

function mib(bytes: number): string {
  return (bytes / MiB).toFixed(1);
}

/** Writes the growth samples and the bounds' verdict. */
export function writeGrowth(sink: Sink, r: GrowthReport): void {
  sink.line(
    `== growth ${r.backend}: ${r.cycles} allocate/release cycles over ${KEYS} keys ` +
      `(${WINDOW} held), ${Math.round(r.durationMs / 1_000)} s`,
  );
  const { growth } = hooksOf(r.backend);
  writeTable(
    sink,
    ["cycles", "s", "RSS MiB", "heap MiB", ...growth.columns],
    r.samples.map((s) => [
      String(s.cycles),
      String(Math.round(s.elapsedMs / 1_000)),
      mib(s.rss),
      mib(s.heapUsed),
      ...growth.row(s),
    ]),
  );
  sink.line(
    r.violations.length === 0
      ? `${GROWTH_CHECK}: ok`
      : `${GROWTH_CHECK}: FAIL\n${r.violations.map((v) => `  ${v.message}`).join("\n")}`,
  );
  sink.line();
}
