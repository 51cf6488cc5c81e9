/**
 * Cilium's side of the side-by-side benchmarks: the programs of `../shared/cilium-node/` (a real
 * Cilium allocator node per process, v1.13.10's `interop` and v1.16's `interop116`, and etcd's Go
 * client's raw ceiling `etcdceil`), found where that folder's build puts them (`$CILIUM_WORK/bin`,
 * default `~/.cache/cilium-node/bin`). Not in CI: when they are not built, the tables say so.
 *
 * Every figure runs the same workload as ours, warm: an untimed warm-up of 300 keys on every node
 * (500 transactions for the raw ceiling), then the timed keys `k8s:bench=<i>;`.
 *
 * @module
 */
import { existsSync } from "node:fs";

/** A Cilium allocator node binary and the release it was built from. */
export interface CiliumNode {
  readonly version: string;
  readonly bin: string;
}

/** What is built on this machine. */
export interface CiliumBuild {
  /** Allocator nodes, v1.13.10 first. */
  readonly nodes: readonly CiliumNode[];
  /** etcd's Go client's one-txn-per-key ceiling, if built. */
  readonly ceiling?: string;
}

const WARM = 300;
const CEILING_WARM = 500;

/** The programs built here, or why there are none. */
export function ciliumBuild(): CiliumBuild | { readonly why: string } {
  const dir = Deno.env.get("CILIUM_WORK") ?? `${Deno.env.get("HOME")}/.cache/cilium-node`;
  const nodes: CiliumNode[] = [];
  for (const [name, version] of [["interop", "v1.13.10"], ["interop116", "v1.16"]]) {
    if (existsSync(`${dir}/bin/${name}`)) nodes.push({ version, bin: `${dir}/bin/${name}` });
  }
  const ceiling = `${dir}/bin/etcdceil`;
  if (nodes.length === 0) return { why: "../shared/cilium-node not built here" };
  return { nodes, ceiling: existsSync(ceiling) ? ceiling : undefined };
}

/** Writes the label sets of keys `0 … count-1` (one label each) to a temp file; its path. */
export async function labelFile(count: number): Promise<string> {
  const path = await Deno.makeTempFile({ prefix: "idalloc-bench-labels-", suffix: ".json" });
  const sets = Array.from({ length: count }, (_, i) => [`k8s:bench=${i}`]);
  await Deno.writeTextFile(path, JSON.stringify(sets));
  return path;
}

/** Runs a program to its end; its JSON output lines. */
async function run(bin: string, args: string[]): Promise<Record<string, number>[]> {
  const out = await new Deno.Command(bin, { args, stdout: "piped", stderr: "piped" }).output();
  const text = new TextDecoder().decode(out.stdout);
  if (!out.success) {
    throw new Error(`${bin} failed (${out.code}): ${new TextDecoder().decode(out.stderr)}`);
  }
  return text.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

/** etcd's Go client's raw ceiling on `url`: transactions per second. */
export async function goCeiling(
  bin: string,
  url: string,
  count: number,
  width: number,
): Promise<number> {
  const [line] = await run(bin, [
    "-etcd",
    url,
    "-n",
    String(count),
    "-concurrency",
    String(width),
    "-warm",
    String(CEILING_WARM),
    "-prefix",
    "bench/raw",
  ]);
  return line.ops_per_s;
}

/** The Cilium node's measurement of one workload (see {@linkcode ciliumRate}). */
export type CiliumWorkload = "new" | "join" | "release" | "realloc";

/**
 * One Cilium node's rate on `url` for `workload` over keys `0 … count-1` (`labels` is their
 * {@linkcode labelFile}), `width` in flight, after its warm-up: new keys; joins of keys a first
 * Cilium node created and holds; final releases (`-release`, which Cilium runs one at a time);
 * cached re-allocations (`-realloc`, 100 rounds).
 */
export async function ciliumRate(
  node: CiliumNode,
  url: string,
  workload: CiliumWorkload,
  labels: string,
  width: number,
): Promise<number> {
  const base = ["-etcd", url, "-labels", labels, "-warm", String(WARM), "-no-mapping"];
  if (workload === "new") {
    const [line] = await run(node.bin, [...base, "-node", "c-a", "-concurrency", String(width)]);
    return line.allocated / (line.alloc_ms / 1000);
  }
  if (workload === "release") {
    const lines = await run(node.bin, [
      ...base,
      "-node",
      "c-a",
      "-concurrency",
      "16",
      "-release",
    ]);
    const released = lines.find((l) => "release_ms" in l)!;
    return released.released / (released.release_ms / 1000);
  }
  if (workload === "realloc") {
    const [line] = await run(
      node.bin,
      [...base, "-node", "c-a", "-concurrency", "16"].concat(
        ["-realloc", "100"],
      ),
    );
    return line.realloc_ops / (line.realloc_ms / 1000);
  }
  // join: the first node creates and holds the keys; the second joins them.
  const first = new Deno.Command(node.bin, {
    args: ["-etcd", url, "-labels", labels, "-node", "c-first", "-concurrency", "16", "-hold"],
    stdout: "piped",
    stderr: "null",
  }).spawn();
  try {
    const reader = first.stdout.pipeThrough(new TextDecoderStream()).getReader();
    let seen = "";
    while (!seen.includes("\n")) {
      const { value, done } = await reader.read();
      if (done) throw new Error("Cilium's first node ended before it held its keys");
      seen += value;
    }
    reader.releaseLock();
    const [line] = await run(node.bin, [...base, "-node", "c-b", "-concurrency", String(width)]);
    return line.allocated / (line.alloc_ms / 1000);
  } finally {
    first.kill("SIGTERM");
    await first.status;
    await first.stdout.cancel().catch(() => {});
  }
}

/**
 * `racers` Cilium nodes allocate the same keys, each one at a time in its own shuffled order
 * (`-seed`), starting together after their warm-ups: the wall time in seconds from the first
 * start to the last end, and whether they agree on every ID.
 */
export async function ciliumRace(
  node: CiliumNode,
  url: string,
  labels: string,
  racers: number,
): Promise<{ seconds: number; agreed: boolean }> {
  const startAt = Date.now() + 4_000;
  const results = await Promise.all(
    Array.from({ length: racers }, (_, n) =>
      new Deno.Command(node.bin, {
        args: [
          "-etcd",
          url,
          "-labels",
          labels,
          "-node",
          `c-racer-${n}`,
          "-concurrency",
          "1",
          "-seed",
          String(n + 1),
          "-warm",
          String(WARM),
          "-start-at",
          String(startAt),
        ],
        stdout: "piped",
        stderr: "piped",
      }).output()),
  );
  const lines = results.map((out) => {
    if (!out.success) throw new Error(new TextDecoder().decode(out.stderr));
    const text = new TextDecoder().decode(out.stdout).split("\n").find((l) => l.startsWith("{"));
    return JSON.parse(text!) as {
      t_start_ms: number;
      t_end_ms: number;
      mapping: Record<string, number>;
    };
  });
  const seconds = (Math.max(...lines.map((l) => l.t_end_ms)) -
    Math.min(...lines.map((l) => l.t_start_ms))) / 1000;
  const [first, ...rest] = lines.map((l) => l.mapping);
  const agreed = rest.every((m) =>
    Object.entries(first).every(([key, id]) => m[key] === id) &&
    Object.keys(m).length === Object.keys(first).length
  );
  return { seconds, agreed };
}
