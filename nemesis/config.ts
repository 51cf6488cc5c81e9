/**
 * The command line of `deno task nemesis`, validated with zod, and the fixed timings and key
 * families every run uses.
 *
 * @module
 */
import { parseArgs } from "node:util";
import type { NemesisTimings } from "../src/testing/nemesis.ts";
import {
  BACKEND_KINDS,
  FAULT_KINDS,
  faultKindsOf,
  GARBAGE_KINDS,
  hooksOf,
  NEMESIS_BACKENDS,
  RUN_KINDS,
} from "./backends.ts";
import { COMPOSED_KINDS } from "./composed.ts";
import {
  withCiliumKeys,
  type Workload,
  type WorkloadName,
  workloadOf,
  WORKLOADS,
} from "./workload.ts";

/** A backend's run: its share of `--seconds`, and the fault phase that fits in that share. */
export interface BackendRun {
  /** The backend's kind. */
  readonly backend: string;
  /** Its share of `--seconds`: the bound of the whole backend run. */
  readonly seconds: number;
  /** Length of its fault phase. */
  readonly faultSeconds: number;
}

/** Everything a run needs to know. */
export interface NemesisOptions {
  /** The backend runs, one after the other. */
  readonly runs: readonly BackendRun[];
  /** `--seconds`: the bound of the whole run, every backend's together (a growth run adds to it). */
  readonly totalSeconds: number;
  /**
   * Length of the fault phase of the backend run at hand, which `runBackend` reads; set per run by
   * {@linkcode optionsForRun}.
   */
  readonly seconds: number;
  readonly seed: number;
  /** idalloc worker processes. */
  readonly nodes: number;
  /** Real Cilium v1.16 nodes beside them (on a backend whose hooks allow it: etcd; see `cilium.ts`). */
  readonly cilium: number;
  /** Enabled fault kinds (of `FAULT_KINDS`; `garbage` stands for every `garbage/<kind>`). */
  readonly faults: ReadonlySet<string>;
  /** The workload the workers put on the cluster (see `workload.ts`). */
  readonly workload: WorkloadName;
  /** Enabled garbage kinds (when `garbage` is enabled). */
  readonly garbage: ReadonlySet<string>;
  /** `--faults` as given (for the command that reproduces a run). */
  readonly faultList: string;
  /** Allocate/release cycles of the growth run after each backend run; 0 (the default) skips it. */
  readonly growthOps: number;
  /** Where logs go; a temporary directory when unset. */
  readonly out?: string;
  /** Keep the logs even when the run is clean. */
  readonly keep: boolean;
}

/** `options` for backend run `run`: its fault phase as `seconds`. */
export function optionsForRun(options: NemesisOptions, run: BackendRun): NemesisOptions {
  return { ...options, seconds: run.faultSeconds };
}

/** Timings of every nemesis process: short, so faults play out within a 90-second run. */
export const TIMINGS: NemesisTimings = {
  leaseTtlMs: 3_000,
  syncIntervalMs: 2_000,
  gcIntervalMs: 1_000,
  callTimeoutMs: 10_000,
};

/** Clock slack of the default workload's backends (where they judge leases by the clock). */
export const CLOCK_SKEW_MS = 500;

/**
 * The workload `name` on `backend`, built on this file's defaults and the backend's own timings;
 * beside Cilium nodes, on the Cilium worker's key family.
 */
export function workloadFor(name: WorkloadName, backend: string, cilium = false): Workload {
  const w = workloadOf(name, {
    timings: TIMINGS,
    clockSkewMs: CLOCK_SKEW_MS,
    plainKeys: plainKeys(),
    plainRange: PLAIN_RANGE,
  });
  const tuned = { ...w, timings: hooksOf(backend).timings(name, w.timings) };
  return cilium ? withCiliumKeys(tuned) : tuned;
}

/** Plain keys: few enough IDs that collected IDs are soon handed to other keys. */
export const PLAIN_KEYS = 200;
/** The plain workers' range: 320 IDs for 200 keys. */
export const PLAIN_RANGE = { min: 256, max: 575 } as const;
/** Identity label sets (the identity layer allocates from cluster 0's range). */
export const IDENTITY_KEYS = 40;
/** The identity layer's range for cluster 0, which the GC loop covers too. */
export const IDENTITY_RANGE = { min: 256, max: 65_535 } as const;

/**
 * The plain key family: Cilium-like label strings, some of them the reference prefix of another
 * (`k8s:app=svc-5;` and `k8s:app=svc-5;/sub;`: etcd's range pitfall).
 */
export function plainKeys(n = PLAIN_KEYS): string[] {
  const keys: string[] = [];
  for (let i = 0; keys.length < n; i++) {
    keys.push(`k8s:app=svc-${i};`);
    if (i % 20 === 0 && keys.length < n) keys.push(`k8s:app=svc-${i};/sub;`);
  }
  return keys;
}

/** The identity key family, as Cilium's kvstore label strings. */
export function identityKeys(n = IDENTITY_KEYS): string[] {
  return Array.from(
    { length: n },
    (_, i) => `k8s:app=id-${i};k8s:io.kubernetes.pod.namespace=nemesis;`,
  );
}

/** Whether worker slot `index` uses the identity layer: every third worker, at least one. */
export function isIdentityWorker(index: number): boolean {
  return index % 3 === 2;
}

/** A mistake on the command line of `deno task nemesis`, said in plain words. */
export class NemesisUsageError extends Error {
  /** Creates the error. */
  constructor(message: string) {
    super(message);
    this.name = "NemesisUsageError";
  }
}

/**
 * What a backend run spends outside its fault phase — starting the store and the workers, letting
 * them settle, probing every key, draining, reading the logs back and checking — in seconds, by
 * backend kind: a fixed part, and a share of the run for the logs, which grow with it. Each
 * backend's harness gives its own (`NemesisHooks.overhead`).
 */
export const OVERHEAD: Readonly<Record<string, { fixed: number; share: number }>> = Object
  .fromEntries(NEMESIS_BACKENDS.map((b) => [b.kind, b.hooks.overhead]));

/**
 * The shortest fault phase: 3 s of warm-up, a second in which one fault starts, and the last 5 s,
 * in which none starts.
 */
export const MIN_FAULT_SECONDS = 9;

/** The fault phase that fits a backend run of `seconds` in all. */
export function faultSeconds(backend: string, seconds: number): number {
  const { fixed, share } = OVERHEAD[backend];
  return Math.floor(seconds - fixed - share * seconds);
}

/** The shortest `--seconds` share a backend run can have. */
export function minSeconds(backend: string): number {
  let seconds = MIN_FAULT_SECONDS;
  while (faultSeconds(backend, seconds) < MIN_FAULT_SECONDS) seconds++;
  return seconds;
}

/** Growth-run cycles per second on Deno KV (200,000 took 218 s on a busy 2-core machine). */
const GROWTH_CYCLES_PER_SECOND = 900;

const DEFAULT_SECONDS = 60;
const MAX_SECONDS = 86_400;

/** `items` as prose: `a`, `a or b`, `a, b or c`. */
function either(items: readonly string[]): string {
  return items.length <= 1
    ? items.join("")
    : `${items.slice(0, -1).join(", ")} or ${items[items.length - 1]}`;
}

/** The sentence of `--help` that says which faults only some backends support. */
function partialFaults(): string {
  const bySupport = new Map<string, string[]>();
  for (const fault of FAULT_KINDS) {
    const on = RUN_KINDS.filter((k) => faultKindsOf(k).includes(fault));
    if (on.length === RUN_KINDS.length) continue;
    const key = either(on);
    bySupport.set(key, [...bySupport.get(key) ?? [], fault]);
  }
  return [...bySupport].map(([on, faults]) => `${faults.join(", ")} run on ${on} only.`)
    .join(" ");
}

/**
 * What `--help` says of the composed stores, which `all` leaves out (their sides run on their
 * own): the double-write store and its migration step.
 */
function composedUsage(): string {
  if (!COMPOSED_KINDS.includes("doublewrite")) return "";
  const { fixed } = OVERHEAD.doublewrite;
  return `doublewrite: idalloc nodes on both an etcd and a kube-apiserver (Cilium's
                           double-write modes), a migration step during the run: nodes start in
                           one read mode and come back from each kill in the other (even seeds
                           toward the CRDs, odd seeds back); drift across the sides is checked.
                           Named only, never part of all; about ${fixed} s outside its fault phase,
                           --seconds ${minSeconds("doublewrite")} at least`;
}

/** Backends whose runs real Cilium nodes can join. */
const CILIUM_KINDS = BACKEND_KINDS.filter((k) => hooksOf(k).cilium);

/** The bounds `--help` gives, from the figures above. */
const BOUNDS = {
  overhead: either(RUN_KINDS.map((k) => `${OVERHEAD[k].fixed} s (${k})`)),
  share: `${OVERHEAD[RUN_KINDS[0]].share * 100}%`,
  least: [
    ...RUN_KINDS.map((k) => `${minSeconds(k)} (${k})`),
    `${RUN_KINDS.length * Math.max(...RUN_KINDS.map(minSeconds))} (all)`,
  ].join(", "),
  growth: GROWTH_CYCLES_PER_SECOND.toLocaleString("en-US"),
};

const USAGE = `deno task nemesis [options]

  --backend ${[...BACKEND_KINDS, "all"].join("|")}
                           store(s) to run against, one after the other (default all: ${
  RUN_KINDS.join(", ")
}).
                           ${composedUsage()}
  --seconds N              about how long the whole run takes, every backend together
                           (default ${DEFAULT_SECONDS}, or the least the chosen backends need):
                           starting the store and the workers, the fault phase, settling,
                           probing, draining and the checks. Each backend gets
                           an equal share; its fault phase is what is left after about
                           ${BOUNDS.overhead} for the rest, and ${BOUNDS.share} for reading the logs.
                           At least ${BOUNDS.least}; at most ${MAX_SECONDS}.
  --seed S                 seed of every random choice (default: random, printed)
  --nodes N                idalloc worker processes, 3 to 32 (default 4; every third uses the
                           identity layer); with --cilium, 1 or more and 3 or more nodes in all
  --cilium N               also run N real Cilium v1.16 nodes (${
  CILIUM_KINDS.join(", ")
} only; default 0): the
                           fault-test worker of ../shared/cilium-node (build.sh --v116), on the
                           same etcd, prefix, keys (k8s:app=k<n>;, which the idalloc workers then
                           use too), ID range and lease; faults target them as well, and the
                           history judges their answers with idalloc's. On k8s: in CRD mode,
                           with CiliumEndpoints for what they hold and Cilium's operator GC rule
                           beside them (heartbeat timeout 10 s; restarted as a fault), and the
                           check that no held or endpoint-named identity is deleted. Exits 1 when
                           not built
  --faults LIST            fault kinds, comma-separated: ${FAULT_KINDS.join(", ")},
                           garbage/<kind> (${GARBAGE_KINDS.join(", ")}); "all" (default);
                           a leading "-" removes a kind: --faults=-stall,-garbage/orphan-ref.
                           ${partialFaults()}
  --workload NAME          ${WORKLOADS.join("|")}: "keyside" crowds 60 keys into 80 IDs with
                           short leases, GC every 500 ms and overlapping faults (default: default)
  --growth N               after each backend's run, N allocate/release cycles on a fresh store,
                           checked for growth; on top of --seconds (about ${BOUNDS.growth} cycles a
                           second on Deno KV, fewer on etcd). Default 0: no growth run.
  --out DIR                keep logs in DIR (default: a temp dir, kept only on violations)
  --keep                   keep the logs of a clean run too
  --help

Exit code: 0 no violation; 1 a violation, or a mistake on this command line; 2 the harness
itself failed (a check may not have run fully).`;

/** `text` as a whole number from `min` to `max`, or a usage error naming `--name`. */
function wholeNumber(name: string, text: string, min: number, max: number, what: string): number {
  const n = /^\d+$/.test(text) ? Number(text) : NaN;
  if (!(n >= min && n <= max)) {
    throw new NemesisUsageError(`--${name} takes ${what} from ${min} to ${max}, not '${text}'`);
  }
  return n;
}

/** `--workload` as given, or a usage error naming the workloads. */
function workloadName(text: string | undefined): WorkloadName {
  if (text === undefined) return "default";
  if (!(WORKLOADS as readonly string[]).includes(text)) {
    throw new NemesisUsageError(`--workload takes ${WORKLOADS.join(" or ")}, not '${text}'`);
  }
  return text as WorkloadName;
}

/** node:util's parseArgs errors in plain words. */
function argsError(err: unknown): NemesisUsageError {
  const code = (err as { code?: string }).code;
  const text = err instanceof Error ? err.message : String(err);
  const quoted = /'([^']*)'/.exec(text)?.[1];
  if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") {
    return new NemesisUsageError(`unknown option ${quoted ?? text} (see --help)`);
  }
  if (code === "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL") {
    return new NemesisUsageError(`unexpected argument '${quoted ?? text}': options start with --`);
  }
  if (code === "ERR_PARSE_ARGS_INVALID_OPTION_VALUE") {
    const option = /--[a-z]+/.exec(text)?.[0] ?? "an option";
    return new NemesisUsageError(`${option} needs a value (see --help)`);
  }
  return new NemesisUsageError(text.split("\n")[0]);
}

/** Parses `--faults`: names, `garbage/<kind>`, `all`, and `-name` removals. */
export function parseFaults(list: string): { faults: Set<string>; garbage: Set<string> } {
  const items = list.split(",").map((s) => s.trim()).filter((s) => s !== "");
  const faults = new Set<string>();
  const garbage = new Set<string>();
  const addAll = () => {
    for (const f of FAULT_KINDS) faults.add(f);
    for (const g of GARBAGE_KINDS) garbage.add(g);
  };
  if (items.length === 0 || items[0].startsWith("-")) addAll();
  for (const item of items) {
    const remove = item.startsWith("-");
    const name = remove ? item.slice(1) : item;
    if (name === "all") {
      if (remove) throw new NemesisUsageError(`'-all' removes everything`);
      addAll();
      continue;
    }
    if (name.startsWith("garbage/")) {
      const kind = name.slice("garbage/".length);
      if (!GARBAGE_KINDS.includes(kind)) {
        throw new NemesisUsageError(
          `unknown garbage kind '${kind}' (have: ${GARBAGE_KINDS.join(", ")})`,
        );
      }
      if (remove) garbage.delete(kind);
      else {
        garbage.add(kind);
        faults.add("garbage");
      }
      continue;
    }
    if (!FAULT_KINDS.includes(name)) {
      throw new NemesisUsageError(
        `unknown fault '${name}' (have: ${FAULT_KINDS.join(", ")}, garbage/<kind>)`,
      );
    }
    const kind = name;
    if (remove) {
      faults.delete(kind);
      if (kind === "garbage") garbage.clear();
    } else {
      faults.add(kind);
      if (kind === "garbage") { for (const g of GARBAGE_KINDS) garbage.add(g); }
    }
  }
  if (garbage.size === 0) faults.delete("garbage");
  return { faults, garbage };
}

/**
 * Parses the command line; returns `undefined` after printing help, throws
 * {@linkcode NemesisUsageError} on a mistake.
 */
export function parseOptions(args: readonly string[]): NemesisOptions | undefined {
  let values;
  try {
    ({ values } = parseArgs({
      args: [...args],
      options: {
        backend: { type: "string" },
        seconds: { type: "string" },
        seed: { type: "string" },
        nodes: { type: "string" },
        cilium: { type: "string" },
        faults: { type: "string" },
        workload: { type: "string" },
        growth: { type: "string" },
        out: { type: "string" },
        keep: { type: "boolean" },
        help: { type: "boolean" },
      },
      strict: true,
    }));
  } catch (err) {
    throw argsError(err);
  }
  if (values.help) {
    console.log(USAGE);
    return undefined;
  }
  const backend = values.backend ?? "all";
  if (backend !== "all" && !BACKEND_KINDS.includes(backend)) {
    throw new NemesisUsageError(
      `--backend takes ${either([...BACKEND_KINDS, "all"])}, not '${backend}'`,
    );
  }
  const backends: readonly string[] = backend === "all" ? RUN_KINDS : [backend];
  const least = backends.length * Math.max(...backends.map(minSeconds));
  // The default fits every chosen backend: a run on all of them needs more than 60 s.
  const totalSeconds = values.seconds === undefined
    ? Math.max(DEFAULT_SECONDS, least)
    : wholeNumber("seconds", values.seconds, 1, MAX_SECONDS, "a whole number of seconds");
  const share = Math.floor(totalSeconds / backends.length);
  const runs = backends.map((b) => ({
    backend: b,
    seconds: share,
    faultSeconds: faultSeconds(b, share),
  }));
  if (runs.some((r) => r.faultSeconds < MIN_FAULT_SECONDS)) {
    const rest = backends.map((b) => `${OVERHEAD[b].fixed} s (${b})`).join(" or ");
    throw new NemesisUsageError(
      `--seconds ${totalSeconds} is too short for ${
        backend === "all" ? "every backend" : backend
      }: it needs at least ${least} (a backend's run spends about ${rest} starting, settling ` +
        `and checking, around at least ${MIN_FAULT_SECONDS} s of faults)`,
    );
  }
  if (values.out === "") throw new NemesisUsageError("--out needs a directory");
  const cilium = values.cilium === undefined
    ? 0
    : wholeNumber("cilium", values.cilium, 0, 16, "a number of Cilium nodes");
  const nodes = values.nodes === undefined
    ? 4
    : wholeNumber("nodes", values.nodes, 1, 32, "a number of worker processes");
  // A cluster of three nodes at least; Cilium nodes count as nodes of it.
  if (nodes + cilium < 3) {
    throw new NemesisUsageError(
      `--nodes ${nodes}${cilium > 0 ? ` with --cilium ${cilium}` : ""}: 3 or more nodes in all ` +
        "(Cilium's included)",
    );
  }
  if (cilium > 0 && !backends.every((b) => hooksOf(b).cilium)) {
    throw new NemesisUsageError(
      `--cilium needs --backend ${
        either(CILIUM_KINDS)
      } (a store Cilium's nodes can use: its kvstore, or its CRDs)`,
    );
  }
  const { faults, garbage } = parseFaults(values.faults ?? "all");
  return {
    runs,
    totalSeconds,
    seconds: runs[0].faultSeconds,
    seed: values.seed === undefined
      ? Math.floor(Math.random() * 1_000_000)
      : wholeNumber("seed", values.seed, 0, 2 ** 31 - 1, "a whole number"),
    nodes,
    cilium,
    faults,
    garbage,
    workload: workloadName(values.workload),
    faultList: values.faults ?? "all",
    growthOps: values.growth === undefined
      ? 0
      : wholeNumber("growth", values.growth, 0, 10_000_000, "a number of cycles"),
    out: values.out,
    keep: values.keep ?? false,
  };
}

/** The faults a run on `backend` injects, as a header lists them. */
export function faultsOf(backend: string, options: NemesisOptions): string {
  const offered = faultKindsOf(backend);
  const kinds = [...options.faults].filter((k) => offered.includes(k));
  const garbage = [...options.garbage].filter((g) => hooksOf(backend).garbageKinds.includes(g));
  const names = kinds.map((k) => k === "garbage" ? `garbage (${garbage.join(", ")})` : k);
  return names.length === 0 ? "none" : names.join(", ");
}
