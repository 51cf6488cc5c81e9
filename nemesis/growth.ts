/**
 * The growth run: one allocator doing allocate/release cycles over 1,000 keys (GC every second),
 * sampled every tenth of the run. Nothing may grow with the number of cycles: masters and key
 * state stay within the key set, references within the held window, dead references and lease
 * records near zero, the change feed within what its retention allows, memory and the KV file
 * within a margin of their size after warm-up.
 *
 * @module
 */
import { startEtcd } from "../tests/_support/etcd.ts";
import type { Sink } from "../src/cli/io.ts";
import { writeTable } from "../src/cli/table.ts";
import { Child } from "./child.ts";
import type { Violation } from "./checks/violation.ts";
import { ETCD_REQUEST_TIMEOUT_MS, KV_TIMINGS, TIMINGS } from "./config.ts";
import type { GrowthConfig, GrowthSample } from "./growth_worker.ts";

/** Check name of the growth bounds. */
export const GROWTH_CHECK = "growth stays bounded";

const KEYS = 1_000;
const WINDOW = 50;
const MiB = 1024 * 1024;

/** What the growth run measured and which bounds it broke. */
export interface GrowthReport {
  readonly backend: "kv" | "etcd";
  readonly cycles: number;
  readonly samples: readonly GrowthSample[];
  readonly violations: readonly Violation[];
  readonly durationMs: number;
}

/** Runs `cycles` allocate/release cycles on a fresh store of `backend`; files go under `dir`. */
export async function runGrowth(
  backend: "kv" | "etcd",
  cycles: number,
  dir: string,
): Promise<GrowthReport> {
  const started = Date.now();
  await Deno.mkdir(dir, { recursive: true });
  // One member is enough here: the run measures idalloc's growth, not raft's.
  await using etcd = backend === "etcd" ? await startEtcd({ members: 1 }) : undefined;
  const config: GrowthConfig = {
    store: etcd
      ? {
        kind: "etcd",
        endpoints: [...etcd.endpoints],
        prefix: "growth",
        requestTimeoutMs: ETCD_REQUEST_TIMEOUT_MS,
      }
      : { kind: "kv", path: `${dir}/growth.kv`, prefix: ["growth"], ...KV_TIMINGS },
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
 * The bounds, per sample: the key set bounds masters and key state, the window bounds live
 * references, dead references stay within one window, one node keeps at most two lease records,
 * the feed holds no more than the entries written in its retention window; after warm-up (the
 * second sample) heap and RSS grow by at most a fixed margin, and so does the KV file.
 */
export function checkGrowth(backend: "kv" | "etcd", samples: readonly GrowthSample[]): Violation[] {
  const out: Violation[] = [];
  const fail = (s: GrowthSample, what: string) =>
    out.push({ check: GROWTH_CHECK, message: `after ${s.cycles} cycles: ${what}`, evidence: s });
  for (const s of samples) {
    const c = (name: string) => s.counts[name] ?? 0;
    const masters = c("id");
    if (masters > KEYS) fail(s, `${masters} masters for ${KEYS} keys`);
    if (backend === "kv") {
      if (c("key") > KEYS) fail(s, `${c("key")} key index entries for ${KEYS} keys`);
      if (c("touch") > KEYS) fail(s, `${c("touch")} touch counters for ${KEYS} keys`);
      if (c("ref") > 2 * WINDOW) fail(s, `${c("ref")} references for ${WINDOW} held keys`);
      if (c("ref (dead)") > WINDOW) fail(s, `${c("ref (dead)")} dead references`);
      if (c("lease") > 2) fail(s, `${c("lease")} lease records for one node`);
      if (c("log") > s.recentChanges + 64) {
        fail(
          s,
          `${
            c("log")
          } change-feed entries, but only ${s.recentChanges} written in the last ${s.logWindowMs} ms`,
        );
      }
    } else {
      if (c("value") > 2 * WINDOW) fail(s, `${c("value")} references for ${WINDOW} held keys`);
      if (c("value (no lease)") > 0) fail(s, `${c("value (no lease)")} references without a lease`);
      if (c("leases") > 2) fail(s, `${c("leases")} etcd leases for one node`);
    }
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
    const fileLimit = warm.fileBytes * 2 + 32 * MiB;
    if (backend === "kv" && last.fileBytes > fileLimit) {
      fail(last, `KV file ${mib(last.fileBytes)} MiB, over ${mib(fileLimit)} MiB`);
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
  const kv = r.backend === "kv";
  writeTable(
    sink,
    kv
      ? [
        "cycles",
        "s",
        "RSS MiB",
        "heap MiB",
        "file MiB",
        "masters",
        "refs",
        "dead refs",
        "leases",
        "feed",
        "feed bound",
      ]
      : ["cycles", "s", "RSS MiB", "heap MiB", "masters", "refs", "leases"],
    r.samples.map((s) => {
      const c = (name: string) => String(s.counts[name] ?? 0);
      const head = [
        String(s.cycles),
        String(Math.round(s.elapsedMs / 1_000)),
        mib(s.rss),
        mib(s.heapUsed),
      ];
      return kv
        ? [
          ...head,
          mib(s.fileBytes),
          c("id"),
          c("ref"),
          c("ref (dead)"),
          c("lease"),
          c("log"),
          String(s.recentChanges + 64),
        ]
        : [...head, c("id"), c("value"), c("leases")];
    }),
  );
  sink.line(
    r.violations.length === 0
      ? `${GROWTH_CHECK}: ok`
      : `${GROWTH_CHECK}: FAIL\n${r.violations.map((v) => `  ${v.message}`).join("\n")}`,
  );
  sink.line();
}
