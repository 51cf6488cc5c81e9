/**
 * Real Cilium v1.16 nodes in CRD mode (`identity-allocation-mode: crd`) beside idalloc, for the
 * interop tests (`tests/backends/k8s/cilium_interop.test.ts`) and the `k8s-cilium` bench group:
 * `interop116 -kubeconfig FILE` from `../shared/cilium-node/` (Cilium's own
 * `pkg/k8s/identitybackend` and `pkg/allocator`, never part of this repository), on a private API
 * server with Cilium's own generated CRDs installed — the YAML that build leaves beside the binary
 * (`$CILIUM_WORK/crds/`), not the copies in `crds.ts`.
 *
 * Neither the binary nor the CRDs are in CI or a user's clone: {@linkcode ciliumCrdUnavailable}
 * says why (loudly, once) and the callers skip.
 *
 * @example
 * ```ts ignore
 * // ignored: starts etcd, kube-apiserver and a Cilium node.
 * const node = ciliumCrdNode();
 * if ("bin" in node) {
 *   await using cluster = await startCiliumCluster(node);
 *   const kubeconfig = await cluster.kubeconfig("admin");
 *   const [line] = await runCilium(node, ["-kubeconfig", kubeconfig, "-node", "c1"]);
 *   console.log(line.sync_ms);
 * }
 * ```
 * @module
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync, statSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { parse } from "../../../deps/yaml.ts";
import { type KubeTestCluster, startKubeApiServer } from "./cluster.ts";
import type { CrdManifest } from "./crds.ts";

/** Environment variable naming the `interop116` binary, overriding the default place. */
export const CILIUM_NODE_ENV = "CILIUM_INTEROP116";

/** A built Cilium v1.16 node and the CRD manifests its build copied from Cilium's tree. */
export interface CiliumCrdNode {
  /** The `interop116` binary. */
  readonly bin: string;
  /** The folder with `ciliumidentities.yaml` and `ciliumendpoints.yaml`. */
  readonly crds: string;
}

/** The CRD files Cilium's CRD mode needs, as the build names them. */
const CRD_FILES = ["ciliumidentities.yaml", "ciliumendpoints.yaml"] as const;

function isFile(path: string): boolean {
  return existsSync(path) && statSync(path).isFile();
}

/**
 * Where the node and its CRDs are: `$CILIUM_INTEROP116` (CRDs in `../crds` beside its `bin/`),
 * else the build's output (`$CILIUM_WORK`, default `${XDG_CACHE_HOME:-~/.cache}/cilium-node`) —
 * or why they are not there.
 */
export function ciliumCrdNode(
  env: Readonly<Record<string, string | undefined>> = process.env,
): CiliumCrdNode | { readonly why: string } {
  const work = env.CILIUM_WORK ??
    join(env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "cilium-node");
  const bin = env[CILIUM_NODE_ENV] ?? join(work, "bin", "interop116");
  const crds = join(bin, "..", "..", "crds");
  const missing = [bin, ...CRD_FILES.map((f) => join(crds, f))].filter((p) => !isFile(p));
  if (missing.length === 0) return { bin, crds };
  return {
    why: `the Cilium v1.16 CRD-mode node is not built here (missing ${missing.join(", ")}). ` +
      "It is a tool for this machine, not part of the project: fetch Cilium's source as a git dir " +
      "(github:skmatti/cilium), run 'bash ../shared/cilium-node/build.sh --v116 <git dir>' (see " +
      `../shared/cilium-node/README.md), or point ${CILIUM_NODE_ENV} at the binary`,
  };
}

let warned = false;

/**
 * Why Cilium's CRD-mode node cannot run here, or `undefined` when it can. The first call that
 * finds it missing prints a banner on stderr, so that a skipped interop test is never silent.
 */
export function ciliumCrdUnavailable(): string | undefined {
  const node = ciliumCrdNode();
  if ("bin" in node) return undefined;
  if (!warned) {
    warned = true;
    const bar = "!".repeat(100);
    console.error(
      `\n${bar}\n!!! SKIPPING THE CILIUM CRD-MODE INTEROP TESTS: ${node.why}\n${bar}\n`,
    );
  }
  return node.why;
}

/** Cilium's own CRDs from the build, ready to install (status and null fields dropped). */
export async function ciliumCrds(node: CiliumCrdNode): Promise<CrdManifest[]> {
  return await Promise.all(CRD_FILES.map(async (file) => {
    const doc = parse(await readFile(join(node.crds, file), "utf8")) as {
      metadata: Record<string, unknown>;
      status?: unknown;
    };
    // controller-gen writes `creationTimestamp: null` and an empty status: not part of a create.
    delete doc.status;
    delete doc.metadata.creationTimestamp;
    return doc as unknown as CrdManifest;
  }));
}

/**
 * A private API server (`startKubeApiServer`) with Cilium's own `CiliumIdentity` and
 * `CiliumEndpoint` CRDs in `cilium.io`, the group Cilium's generated clientset uses.
 */
export async function startCiliumCluster(node: CiliumCrdNode): Promise<KubeTestCluster> {
  const cluster = await startKubeApiServer({ ciliumCrds: false });
  try {
    for (const crd of await ciliumCrds(node)) await cluster.installCrd(crd);
  } catch (err) {
    await cluster.close();
    throw err;
  }
  return cluster;
}

/** One JSON line of the node (see `../shared/cilium-node/README.md` for the fields). */
export interface CiliumLine {
  readonly node?: string;
  readonly sync_ms?: number;
  readonly alloc_ms?: number;
  readonly t_start_ms?: number;
  readonly t_end_ms?: number;
  readonly allocated?: number;
  readonly is_new?: number;
  readonly errors?: readonly string[];
  /** Key (`source:key=value;`…) → the ID its `Allocate` answered. */
  readonly mapping?: Readonly<Record<string, number>>;
  /** Per `-gc` round in CRD mode: what the operator's rule did. */
  readonly gc?: readonly {
    readonly identities: number;
    readonly marked: number;
    readonly deleted: number;
    readonly conflicts: number;
  }[];
  readonly [field: string]: unknown;
}

function jsonLines(text: string): CiliumLine[] {
  return text.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l));
}

/** Runs the node with `args` to its end; its JSON lines (throws with its stderr if it fails). */
export function runCilium(node: CiliumCrdNode, args: readonly string[]): Promise<CiliumLine[]> {
  return new Promise((resolve, reject) => {
    execFile(node.bin, args, { maxBuffer: 256 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`interop116 ${args.join(" ")} failed: ${stderr || err.message}`));
      else resolve(jsonLines(stdout));
    });
  });
}

/**
 * A node left running (`-hold`, a long `-gc`): its JSON lines as they come; SIGTERM ends a
 * holding node cleanly (it prints its later lines, e.g. `-release`'s), disposing kills it.
 */
export class CiliumProcess implements AsyncDisposable {
  /** The JSON lines so far. */
  readonly lines: CiliumLine[] = [];
  /** Resolves with the exit code (or signal) once the node has ended. */
  readonly exited: Promise<number | string>;
  readonly #child: ChildProcess;
  #stderr = "";
  #partial = "";
  #done = false;
  #wake: (() => void)[] = [];

  constructor(node: CiliumCrdNode, args: readonly string[]) {
    this.#child = spawn(node.bin, args, { stdio: ["ignore", "pipe", "pipe"] });
    this.#child.stdout!.setEncoding("utf8");
    this.#child.stdout!.on("data", (chunk: string) => {
      const parts = (this.#partial + chunk).split("\n");
      this.#partial = parts.pop()!;
      this.lines.push(...jsonLines(parts.join("\n")));
      this.#notify();
    });
    this.#child.stderr!.setEncoding("utf8");
    this.#child.stderr!.on("data", (chunk: string) => (this.#stderr += chunk));
    this.exited = new Promise((resolve) => {
      this.#child.once("close", (code, signal) => {
        this.lines.push(...jsonLines(this.#partial));
        this.#partial = "";
        this.#done = true;
        resolve(code ?? signal ?? "?");
        this.#notify();
      });
    });
  }

  /** What the node wrote to stderr so far. */
  get stderr(): string {
    return this.#stderr;
  }

  /** Waits for the `n`-th JSON line (1-based); throws with stderr if the node ends first. */
  async line(n = 1): Promise<CiliumLine> {
    while (this.lines.length < n) {
      if (this.#done) throw new Error(`interop116 ended before line ${n}: ${this.#stderr}`);
      await new Promise<void>((resolve) => this.#wake.push(resolve));
    }
    return this.lines[n - 1];
  }

  /** SIGTERM, then waits for its end: a holding node releases (`-release`) and exits. */
  async stop(): Promise<void> {
    this.#child.kill("SIGTERM");
    await this.exited;
  }

  /** Kills the node unless it has ended, and waits for it. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.#done) this.#child.kill("SIGKILL");
    await this.exited;
  }

  #notify(): void {
    for (const wake of this.#wake.splice(0)) wake();
  }
}
