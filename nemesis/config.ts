/**
 * The command line of `deno task nemesis`, validated with zod, and the fixed timings and key
 * families every run uses.
 *
 * @module
 */
import { parseArgs } from "node:util";
import { z } from "zod";
import type { Timings } from "./records.ts";
import { GARBAGE_KINDS } from "./stores/store.ts";
import {
  withCiliumKeys,
  type Workload,
  type WorkloadName,
  workloadOf,
  WORKLOADS,
} from "./workload.ts";

/** Faults the suite can inject. `garbage` stands for every `garbage/<kind>`. */
export const FAULT_KINDS = [
  "kill",
  "stall",
  "lease-revoke",
  "garbage",
  "compact",
  "kill-follower",
  "kill-leader",
  "outage",
] as const;

/** A fault kind. */
export type FaultKind = typeof FAULT_KINDS[number];

/** Fault kinds that need an etcd cluster. */
export const ETCD_ONLY: ReadonlySet<FaultKind> = new Set([
  "compact",
  "kill-follower",
  "kill-leader",
  "outage",
]);

/** Everything a run needs to know. */
export interface NemesisOptions {
  readonly backends: readonly ("kv" | "etcd")[];
  readonly seconds: number;
  readonly seed: number;
  /** idalloc worker processes. */
  readonly nodes: number;
  /** Real Cilium v1.16 nodes beside them (etcd only; see `cilium.ts`). */
  readonly cilium: number;
  /** Enabled fault kinds. */
  readonly faults: ReadonlySet<FaultKind>;
  /** The workload the workers put on the cluster (see `workload.ts`). */
  readonly workload: WorkloadName;
  /** Enabled garbage kinds (when `garbage` is enabled). */
  readonly garbage: ReadonlySet<string>;
  /** `--faults` as given (for the command that reproduces a run). */
  readonly faultList: string;
  /** Allocate/release cycles of the growth run; 0 skips it. */
  readonly growthOps: number;
  /** Where logs go; a temporary directory when unset. */
  readonly out?: string;
  /** Keep the logs even when the run is clean. */
  readonly keep: boolean;
}

/** Timings of every nemesis process: short, so faults play out within a 90-second run. */
export const TIMINGS: Timings = {
  leaseTtlMs: 3_000,
  syncIntervalMs: 2_000,
  gcIntervalMs: 1_000,
  callTimeoutMs: 10_000,
};

/** The workers' Deno KV backend timings. */
export const KV_TIMINGS = { pollIntervalMs: 200, maxClockSkewMs: 500, resyncIntervalMs: 15_000 };

/** The workers' etcd request timeout. */
export const ETCD_REQUEST_TIMEOUT_MS = 3_000;

/**
 * The workload `name` on `backend`, built on this file's defaults; beside Cilium nodes, on the
 * Cilium worker's key family.
 */
export function workloadFor(name: WorkloadName, backend: "kv" | "etcd", cilium = false): Workload {
  const w = workloadOf(name, backend, {
    timings: TIMINGS,
    kv: KV_TIMINGS,
    plainKeys: plainKeys(),
    plainRange: PLAIN_RANGE,
  });
  return cilium ? withCiliumKeys(w) : w;
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

const USAGE = `deno task nemesis [options]

  --backend kv|etcd|both   store(s) to run against (default both)
  --seconds N              length of the fault phase per backend (default 60)
  --seed S                 seed of every random choice (default: random, printed)
  --nodes N                idalloc worker processes, 3 or more (default 4; every third uses the
                           identity layer); with --cilium, 1 or more and 3 or more nodes in all
  --cilium N               also run N real Cilium v1.16 nodes (etcd only; default 0): the
                           fault-test worker of ../shared/cilium-node (build.sh --v116), on the
                           same etcd, prefix, keys (k8s:app=k<n>;, which the idalloc workers then
                           use too), ID range and lease; faults target them as well, and the
                           history judges their answers with idalloc's. Exits 1 when not built
  --faults LIST            fault kinds, comma-separated: ${FAULT_KINDS.join(", ")},
                           garbage/<kind> (${GARBAGE_KINDS.join(", ")}); "all" (default);
                           a leading "-" removes a kind: --faults=-stall,-garbage/orphan-ref
  --workload NAME          ${WORKLOADS.join("|")}: "keyside" crowds 60 keys into 80 IDs with
                           short leases and GC every 500 ms (default: default)
  --growth N               allocate/release cycles of the growth run (default 200000; 0 skips it)
  --out DIR                keep logs in DIR (default: a temp dir, kept only on violations)
  --keep                   keep the logs of a clean run too
  --help`;

const optionsSchema = z.object({
  backend: z.enum(["kv", "etcd", "both"]).default("both"),
  seconds: z.coerce.number().int().min(10).max(86_400).default(60),
  seed: z.coerce.number().int().min(0).max(2 ** 31 - 1).optional(),
  nodes: z.coerce.number().int().min(1).max(32).default(4),
  cilium: z.coerce.number().int().min(0).max(16).default(0),
  faults: z.string().default("all"),
  workload: z.enum(WORKLOADS).default("default"),
  growth: z.coerce.number().int().min(0).max(10_000_000).default(200_000),
  out: z.string().min(1).optional(),
  keep: z.boolean().default(false),
});

/** Parses `--faults`: names, `garbage/<kind>`, `all`, and `-name` removals. */
export function parseFaults(list: string): { faults: Set<FaultKind>; garbage: Set<string> } {
  const items = list.split(",").map((s) => s.trim()).filter((s) => s !== "");
  const faults = new Set<FaultKind>();
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
      if (remove) throw new Error(`'-all' removes everything`);
      addAll();
      continue;
    }
    if (name.startsWith("garbage/")) {
      const kind = name.slice("garbage/".length);
      if (!(GARBAGE_KINDS as readonly string[]).includes(kind)) {
        throw new Error(`unknown garbage kind '${kind}' (have: ${GARBAGE_KINDS.join(", ")})`);
      }
      if (remove) garbage.delete(kind);
      else {
        garbage.add(kind);
        faults.add("garbage");
      }
      continue;
    }
    if (!(FAULT_KINDS as readonly string[]).includes(name)) {
      throw new Error(`unknown fault '${name}' (have: ${FAULT_KINDS.join(", ")}, garbage/<kind>)`);
    }
    const kind = name as FaultKind;
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

/** Parses the command line; returns `undefined` after printing help, throws on bad input. */
export function parseOptions(args: readonly string[]): NemesisOptions | undefined {
  const { values } = parseArgs({
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
  });
  if (values.help) {
    console.log(USAGE);
    return undefined;
  }
  const parsed = optionsSchema.safeParse(values);
  if (!parsed.success) {
    throw new Error(`${z.prettifyError(parsed.error)}\n\n${USAGE}`);
  }
  const o = parsed.data;
  // A cluster of three nodes at least; Cilium nodes count as nodes of it.
  if (o.nodes + o.cilium < 3) {
    throw new Error(`--nodes: 3 or more nodes in all (Cilium's included)\n\n${USAGE}`);
  }
  if (o.cilium > 0 && o.backend !== "etcd") {
    throw new Error(`--cilium needs --backend etcd (Cilium's kvstore is etcd)\n\n${USAGE}`);
  }
  const { faults, garbage } = parseFaults(o.faults);
  return {
    backends: o.backend === "both" ? ["kv", "etcd"] : [o.backend],
    seconds: o.seconds,
    seed: o.seed ?? Math.floor(Math.random() * 1_000_000),
    nodes: o.nodes,
    cilium: o.cilium,
    faults,
    garbage,
    workload: o.workload,
    faultList: o.faults,
    growthOps: o.growth,
    out: o.out,
    keep: o.keep,
  };
}
