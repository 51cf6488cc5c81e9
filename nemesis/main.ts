/**
 * `deno task nemesis`: kills, stalls, outages and garbage under load, with the invariants checked
 * from the store and from every answer the workers gave. A bounded, seeded run per backend prints
 * a table; `--seconds` bounds the whole run (a growth run, only when asked for with `--growth`,
 * comes on top). Exits 1 on any violation or a mistake on the command line, 2 when the harness
 * itself failed.
 *
 * ```sh
 * deno task nemesis --backend all --seconds 180
 * deno task nemesis --backend deno-kv --seconds 60
 * deno task nemesis --backend etcd --seconds 3600 --seed 4242   # a release check
 * deno task nemesis --faults -stall --seed 17                   # everything but stalls
 * deno task nemesis --backend etcd --nodes 2 --cilium 2 --workload keyside  # beside Cilium
 * ```
 *
 * @module
 */
import { processIo, Sink } from "../src/cli/io.ts";
import { NEMESIS_BACKENDS } from "./backends.ts";
import { ciliumUnavailable } from "./cilium.ts";
import {
  type BackendRun,
  faultsOf,
  type NemesisOptions,
  NemesisUsageError,
  optionsForRun,
  parseOptions,
} from "./config.ts";
import { runGrowth, writeGrowth } from "./growth.ts";
import { clean, writeReport } from "./report.ts";
import { runBackend } from "./run.ts";
import { Child } from "./child.ts";

/** The command that repeats `run` alone: its share of `--seconds`, its seed, no growth run. */
function command(o: NemesisOptions, run: BackendRun): string {
  const parts = [
    "deno task nemesis",
    `--backend ${run.backend}`,
    `--seconds ${run.seconds}`,
    `--seed ${o.seed}`,
    `--nodes ${o.nodes}`,
  ];
  if (o.cilium > 0) parts.push(`--cilium ${o.cilium}`);
  if (o.faultList !== "all") parts.push(`--faults=${o.faultList}`);
  if (o.workload !== "default") parts.push(`--workload ${o.workload}`);
  return parts.join(" ");
}

async function main(): Promise<number> {
  let options: NemesisOptions | undefined;
  try {
    options = parseOptions(Deno.args);
  } catch (err) {
    if (!(err instanceof NemesisUsageError)) throw err;
    console.error(`nemesis: ${err.message}`);
    return 1;
  }
  if (!options) return 0;
  if (options.cilium > 0) {
    // Asked for explicitly, so its absence fails the run (CI never passes --cilium).
    const why = ciliumUnavailable();
    if (why) {
      console.error(`nemesis: --cilium ${options.cilium}: ${why}`);
      return 1;
    }
  }
  const sink = new Sink(processIo().stdout, 0);
  const root = options.out ?? await Deno.makeTempDir({ prefix: "idalloc-nemesis-" });
  stopOnInterrupt(root, options.out === undefined && !options.keep);
  const runs = options.runs.map((r) => `${r.backend} for ${r.seconds} s`).join(", then ");
  const growth = options.growthOps > 0
    ? `then ${options.growthOps.toLocaleString("en-US")} growth cycles after each (on top)`
    : "no growth run (--growth N adds one)";
  sink.line(`nemesis: seed ${options.seed}, ${runs}; ${growth}; logs in ${root}`);
  let ok = true;
  /** Whether the harness itself failed somewhere, so that a check may not have run fully. */
  let harness = false;
  for (const run of options.runs) {
    const { backend } = run;
    const why = NEMESIS_BACKENDS.find((b) => b.kind === backend)?.unavailable();
    if (why) {
      sink.line(`== nemesis ${backend}: skipped: ${why}`);
      continue;
    }
    try {
      const report = await runBackend(backend, optionsForRun(options, run), `${root}/${backend}`);
      writeReport(sink, report, { run, faults: faultsOf(backend, options) }, command(options, run));
      ok &&= clean(report);
      harness ||= report.harness.length > 0;
      if (options.growthOps > 0) {
        const growth = await runGrowth(backend, options.growthOps, `${root}/${backend}-growth`);
        writeGrowth(sink, growth);
        ok &&= growth.violations.length === 0;
      }
    } catch (err) {
      harness = true;
      sink.line(
        `== nemesis ${backend}: the harness failed: ${err instanceof Error ? err.stack : err}`,
      );
    }
    await sink.flush();
  }
  sink.line(
    !ok
      ? "nemesis: VIOLATIONS FOUND (see above)"
      : harness
      ? "nemesis: no violation found, but the harness had problems (see above)"
      : "nemesis: no violation",
  );
  await sink.flush();
  if (ok && !harness && !options.keep && options.out === undefined) {
    await Deno.remove(root, { recursive: true }).catch(() => {});
  }
  return !ok ? 1 : harness ? 2 : 0;
}

/**
 * Ctrl-C or SIGTERM: the run's processes are killed (a private etcd's watchdog stops it when this
 * process exits), and, as an interrupted run has no verdict to keep evidence for, its directory goes
 * as a clean finished run's does, unless it is to be kept (`--keep`, `--out`).
 */
function stopOnInterrupt(root: string, remove: boolean): void {
  const stop = (signal: Deno.Signal) => {
    Child.killAll();
    console.error(
      `nemesis: ${signal}: stopped its processes, ${remove ? "removing" : "keeping"} ${root}`,
    );
    if (remove) {
      try {
        Deno.removeSync(root, { recursive: true });
      } catch {
        // already gone
      }
    }
    Deno.exit(130);
  };
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    Deno.addSignalListener(signal, () => stop(signal));
  }
}

Deno.exit(await main());
