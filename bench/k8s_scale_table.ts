/**
 * The pure parts of the `k8s-scale` bench (`k8s_scale.ts`): its flags, the API server's request
 * counters (`apiserver_request_total` in `/metrics`), the growth fitted to a figure measured at
 * several sizes, and the table — as bench rows and as Markdown for docs/performance.md.
 *
 * @module
 */
import { type BenchRow, fmt } from "./_table.ts";

/** A scenario of the bench. */
export type ScaleScenario = "join" | "race" | "gc";

/** The scenarios, in the order they run. */
export const SCALE_SCENARIOS: readonly ScaleScenario[] = ["join", "race", "gc"];

/** The bench's options (see {@linkcode parseScaleArgs}). */
export interface ScaleOptions {
  /** Simulated idalloc node counts, ascending. */
  readonly nodes: readonly number[];
  readonly scenarios: readonly ScaleScenario[];
  /** Worker processes the nodes are spread over. */
  readonly workers: number;
  /** Cilium v1.16 CRD-mode node processes in the side-by-side race. */
  readonly ciliumNodes: number;
  /** Identity counts of the GC pass, ascending (half of each named by CiliumEndpoints). */
  readonly gcIdentities: readonly number[];
  /** The steady-state window over which requests per second are counted, s. */
  readonly windowS: number;
  /** Print the table as Markdown on stderr as well. */
  readonly markdown: boolean;
}

/** The full-size defaults: what docs/performance.md reports. */
export const FULL: ScaleOptions = {
  nodes: [50, 100, 200],
  scenarios: SCALE_SCENARIOS,
  workers: 4,
  ciliumNodes: 8,
  gcIdentities: [2_500, 5_000, 10_000],
  // The backend's syncs run every 60 s and its Lease renewals every 20 s: a shorter window
  // would miss the syncs, a longer one only costs time.
  windowS: 60,
  markdown: false,
};

/** `--quick`: a smoke test of every scenario in about a minute. */
export const QUICK: ScaleOptions = {
  nodes: [4, 8],
  scenarios: SCALE_SCENARIOS,
  workers: 2,
  ciliumNodes: 2,
  gcIdentities: [40, 80],
  windowS: 2,
  markdown: false,
};

/** The bench's flags, for `--help`. */
export const SCALE_USAGE = `k8s-scale options:
  --nodes 50,100,200      simulated idalloc node counts (default ${FULL.nodes.join(",")})
  --scenarios join,race,gc  which scenarios (default all)
  --workers N             worker processes hosting the nodes (default ${FULL.workers})
  --cilium-nodes N        Cilium v1.16 CRD-mode processes in the side-by-side race (default ${FULL.ciliumNodes})
  --gc-identities 2500,…  identity counts of the GC pass (default ${FULL.gcIdentities.join(",")})
  --window S              steady-state window in seconds (default ${FULL.windowS})
  --markdown              also print the table as Markdown (stderr)
  --quick                 small sizes for a smoke test (${QUICK.nodes.join(",")} nodes)`;

/** A bad `k8s-scale` flag. */
export class ScaleUsageError extends Error {
  /** @param message What is wrong, naming the flag. */
  constructor(message: string) {
    super(message);
    this.name = "ScaleUsageError";
  }
}

function counts(flag: string, text: string | undefined): number[] {
  const xs = (text ?? "").split(",").map(Number);
  if (xs.length === 0 || xs.some((x) => !Number.isSafeInteger(x) || x < 1)) {
    throw new ScaleUsageError(`${flag} takes whole numbers ≥ 1, separated by commas`);
  }
  return [...new Set(xs)].sort((a, b) => a - b);
}

function whole(flag: string, text: string | undefined): number {
  return counts(flag, text)[0];
}

/**
 * Takes the bench's own flags out of `args` (in place, so that the caller sees only the rest)
 * and returns the options: `--quick`'s sizes, else the full ones, with each given flag on top.
 * Throws {@linkcode ScaleUsageError} on a bad value.
 */
export function parseScaleArgs(args: string[]): ScaleOptions {
  const take = (flag: string): string | undefined => {
    const at = args.indexOf(flag);
    if (at === -1) return undefined;
    const [, value] = args.splice(at, 2);
    if (value === undefined) throw new ScaleUsageError(`${flag} needs a value`);
    return value;
  };
  const has = (flag: string): boolean => {
    const at = args.indexOf(flag);
    if (at !== -1) args.splice(at, 1);
    return at !== -1;
  };
  let o: ScaleOptions = has("--quick") ? QUICK : FULL;
  o = { ...o, markdown: has("--markdown") };
  const nodes = take("--nodes");
  if (nodes !== undefined) o = { ...o, nodes: counts("--nodes", nodes) };
  const scenarios = take("--scenarios");
  if (scenarios !== undefined) {
    const named = scenarios.split(",");
    const wrong = named.filter((s) => !SCALE_SCENARIOS.includes(s as ScaleScenario));
    if (wrong.length > 0) {
      throw new ScaleUsageError(
        `--scenarios: unknown ${wrong.join(", ")} (known: ${SCALE_SCENARIOS.join(", ")})`,
      );
    }
    o = { ...o, scenarios: SCALE_SCENARIOS.filter((s) => named.includes(s)) };
  }
  const workers = take("--workers");
  if (workers !== undefined) o = { ...o, workers: whole("--workers", workers) };
  const cilium = take("--cilium-nodes");
  if (cilium !== undefined) o = { ...o, ciliumNodes: whole("--cilium-nodes", cilium) };
  const gc = take("--gc-identities");
  if (gc !== undefined) o = { ...o, gcIdentities: counts("--gc-identities", gc) };
  const window = take("--window");
  if (window !== undefined) o = { ...o, windowS: whole("--window", window) };
  return o;
}

/** Request counts by `"VERB resource"` (`"PATCH ciliumidentities"`, `"PUT leases"`). */
export type RequestCounts = ReadonlyMap<string, number>;

/**
 * Sums `/metrics`' `apiserver_request_total` by verb and resource (subresource after a slash),
 * over codes, scopes and versions. Non-resource requests (`/metrics`, `/readyz`) are left out.
 */
export function requestCounts(metrics: string): RequestCounts {
  const out = new Map<string, number>();
  for (const line of metrics.split("\n")) {
    if (!line.startsWith("apiserver_request_total{")) continue;
    const close = line.lastIndexOf("}");
    const labels = Object.fromEntries(
      [...line.slice(0, close).matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]),
    );
    if (!labels.resource) continue;
    const what = `${labels.verb} ${labels.resource}${
      labels.subresource ? `/${labels.subresource}` : ""
    }`;
    out.set(what, (out.get(what) ?? 0) + Number(line.slice(close + 1).trim()));
  }
  return out;
}

/** `after − before`, per verb and resource, dropping what did not change. */
export function requestDelta(before: RequestCounts, after: RequestCounts): RequestCounts {
  const out = new Map<string, number>();
  for (const [what, n] of after) {
    const d = n - (before.get(what) ?? 0);
    if (d > 0) out.set(what, d);
  }
  return out;
}

/** The sum of every count. */
export function totalRequests(counts: RequestCounts): number {
  let sum = 0;
  for (const n of counts.values()) sum += n;
  return sum;
}

/** The largest `top` counts as `PATCH ciliumidentities 3.2, PUT leases 1.1` (each ÷ `per`). */
export function topRequests(counts: RequestCounts, per = 1, top = 3): string {
  if (counts.size === 0) return "none";
  return [...counts].sort((a, b) => b[1] - a[1]).slice(0, top)
    .map(([what, n]) => `${what} ${round(n / per)}`).join(", ");
}

/** A number with 3 significant digits at most, thousands separated. */
export function round(x: number): string {
  if (!Number.isFinite(x)) return String(x);
  if (Math.abs(x) >= 100) return fmt(x);
  return String(Number(x.toPrecision(3)));
}

/** The `q`-quantile (0–1) of `xs`, nearest rank. */
export function quantile(xs: readonly number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

/** How a figure grows with the size: `y ≈ c·x^exponent`, and the least-squares slope. */
export interface Growth {
  /** The exponent of the power law fitted in log–log space (1 = linear, 2 = quadratic). */
  readonly exponent: number;
  /** The linear least-squares slope: what one more unit of size adds. */
  readonly slope: number;
  /** The power law's value at `x`. */
  predict(x: number): number;
}

/**
 * Fits `points` (size, value): the power law through them in log–log space and the linear slope.
 * `undefined` with fewer than two sizes, or a value ≤ 0 (no logarithm).
 */
export function fitGrowth(points: readonly (readonly [number, number])[]): Growth | undefined {
  if (new Set(points.map(([x]) => x)).size < 2 || points.some(([, y]) => !(y > 0))) {
    return undefined;
  }
  const line = (ps: readonly (readonly [number, number])[]) => {
    const n = ps.length;
    const mx = ps.reduce((s, [x]) => s + x, 0) / n;
    const my = ps.reduce((s, [, y]) => s + y, 0) / n;
    const sxy = ps.reduce((s, [x, y]) => s + (x - mx) * (y - my), 0);
    const sxx = ps.reduce((s, [x]) => s + (x - mx) ** 2, 0);
    const slope = sxy / sxx;
    return { slope, intercept: my - slope * mx };
  };
  const log = line(points.map(([x, y]) => [Math.log(x), Math.log(y)]));
  return {
    exponent: log.slope,
    slope: line(points).slope,
    predict: (x) => Math.exp(log.intercept + log.slope * Math.log(x)),
  };
}

/** A figure measured at several sizes. */
export interface Figure {
  /** The row's name, e.g. `join: time until all hold`. */
  readonly name: string;
  /** The figure's value at each size (a size without one is "—"). */
  readonly values: ReadonlyMap<number, number>;
  /** How a value prints (`1,234 ms`). */
  readonly format: (x: number) => string;
  /** Extra words after the values (a breakdown, a side-by-side figure). */
  readonly note?: string;
  /** The size the prediction is for (5,000 nodes), or none: not a growing figure. */
  readonly predictAt?: number;
  /** The unit of size, for the slope (`node`, `identity`). */
  readonly per?: string;
  /** A value above which the prediction is flagged (a Kubernetes limit), and its name. */
  readonly limit?: { readonly value: number; readonly what: string };
}

/** Formats milliseconds: `840 ms`, `12.3 s`. */
export function ms(x: number): string {
  return x < 10_000 ? `${round(x)} ms` : `${round(x / 1000)} s`;
}

/** Formats bytes: `512 B`, `12.3 KiB`, `4.5 MiB`, `1.2 GiB`. */
export function bytes(x: number): string {
  if (x < 1024) return `${round(x)} B`;
  if (x < 1024 ** 2) return `${round(x / 1024)} KiB`;
  if (x < 1024 ** 3) return `${round(x / 1024 ** 2)} MiB`;
  return `${round(x / 1024 ** 3)} GiB`;
}

function growthCells(f: Figure): { growth: string; predicted: string } {
  if (f.predictAt === undefined) return { growth: "", predicted: "" };
  const g = fitGrowth([...f.values]);
  if (!g) return { growth: "—", predicted: "—" };
  const p = g.predict(f.predictAt);
  const over = f.limit && p > f.limit.value ? ` (over ${f.limit.what})` : "";
  return {
    growth: `∝ ${f.per ?? "n"}^${g.exponent.toFixed(2)}, ${f.format(g.slope)}/${f.per ?? "n"}`,
    predicted: `${f.format(p)}${over}`,
  };
}

/**
 * The table as bench rows: one per figure, its value at each size, then the fitted growth and
 * the prediction (`50: 1.2 s · 100: 2.5 s | ∝ node^1.04, 25 ms/node | at 5,000: 131 s`).
 */
export function scaleRows(figures: readonly Figure[]): BenchRow[] {
  return figures.map((f) => {
    const values = [...f.values].map(([n, y]) => `${fmt(n)}: ${f.format(y)}`).join(" · ");
    const { growth, predicted } = growthCells(f);
    const fit = f.predictAt === undefined
      ? ""
      : ` | ${growth} | at ${fmt(f.predictAt)}: ${predicted}`;
    return { name: `k8s-scale ${f.name}`, value: `${values}${fit}${f.note ? ` | ${f.note}` : ""}` };
  });
}

/**
 * The rows of one size as soon as it is measured (a run ended early keeps what it finished):
 * `k8s-scale at 50 nodes: join: time until all hold` → `5.2 s`, with the figure's note.
 */
export function sizeRows(figures: readonly Figure[], size: number, unit: string): BenchRow[] {
  return figures.flatMap((f) => {
    const value = f.values.get(size);
    if (value === undefined && f.note === undefined) return [];
    const cell = value === undefined ? "" : f.format(value);
    return [{
      name: `k8s-scale at ${fmt(size)} ${unit}: ${f.name}`,
      value: [cell, f.note].filter((x) => x).join(" | "),
    }];
  });
}

/** The table in Markdown: a column per size, then growth and prediction, then notes. */
export function scaleMarkdown(figures: readonly Figure[]): string {
  const sizes = [...new Set(figures.flatMap((f) => [...f.values.keys()]))].sort((a, b) => a - b);
  const head = ["measure", ...sizes.map(fmt), "growth", "predicted", "note"];
  const lines = [head, head.map(() => "---")];
  for (const f of figures) {
    const { growth, predicted } = growthCells(f);
    const at = f.predictAt === undefined ? "" : `at ${fmt(f.predictAt)}: ${predicted}`;
    lines.push([
      f.name,
      ...sizes.map((n) => f.values.has(n) ? f.format(f.values.get(n)!) : ""),
      growth,
      at,
      f.note ?? "",
    ]);
  }
  return lines.map((cells) => `| ${cells.join(" | ")} |`).join("\n");
}
