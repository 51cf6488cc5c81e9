/**
 * Runs the CLI in-process and captures what it writes; a temp dir holding a fresh Deno KV path.
 */
import { type CliIo, main } from "../../src/cli/main.ts";
import { ChildOutput } from "../_support/child_output.ts";

/** The repository's root (where `src/cli/main.ts` is run from). */
export const ROOT = new URL("../../", import.meta.url).pathname;

/** `idalloc <args>` as a process of its own (with `env` added), reading its stdout. */
export function spawnCli(
  args: readonly string[],
  env: Record<string, string> = {},
): { child: Deno.ChildProcess; output: ChildOutput } {
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "src/cli/main.ts", ...args],
    cwd: ROOT,
    env,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  return { child, output: new ChildOutput(child, `idalloc ${args.join(" ")}`) };
}

/** `idalloc <args>` as a process of its own (with `env` added), run to its end. */
export async function runCli(
  args: readonly string[],
  env: Record<string, string> = {},
): Promise<CliResult> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "-A", "src/cli/main.ts", ...args],
    cwd: ROOT,
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const text = new TextDecoder();
  return { code: out.code, stdout: text.decode(out.stdout), stderr: text.decode(out.stderr) };
}

/** What one CLI run produced. */
export interface CliResult {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Captured output that a test can poll while the command still runs (watch, --hold). */
export class Capture {
  stdout = "";
  stderr = "";

  get io(): CliIo {
    return {
      stdout: { write: (text: string) => void (this.stdout += text) },
      stderr: { write: (text: string) => void (this.stderr += text) },
    };
  }

  /** Resolves once `predicate(stdout)` holds; fails after `timeoutMs` (a hang, not a speed check). */
  async waitFor(predicate: (stdout: string) => boolean, timeoutMs = 15_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!predicate(this.stdout)) {
      if (Date.now() > deadline) {
        throw new Error(`output never matched:\n${this.stdout}\nstderr:\n${this.stderr}`);
      }
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

/** Runs `main(args)` to the end. */
export async function cli(args: string[], signal?: AbortSignal): Promise<CliResult> {
  const capture = new Capture();
  const code = await main(args, { ...capture.io, signal });
  return { code, stdout: capture.stdout, stderr: capture.stderr };
}

/**
 * Resolves once no reference of `node` is live any more (its lease lapsed: a run with a short
 * `--lease-ttl` that ended), polling `refs`; fails after `timeoutMs`. Release and GC delete only
 * what dead nodes left.
 */
export async function untilDead(
  args: readonly string[],
  node: string,
  timeoutMs = 15_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const refs: { node: string; live: boolean }[] = JSON.parse(
      (await cli([...args, "refs", "--json"])).stdout,
    );
    if (!refs.some((r) => r.node === node && r.live)) return;
    if (Date.now() > deadline) {
      throw new Error(`node ${node} is still live: ${JSON.stringify(refs)}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A fresh temp dir with a KV path in it; removed on dispose. */
export class TempStore implements AsyncDisposable {
  readonly dir: string;
  readonly path: string;

  private constructor(dir: string) {
    this.dir = dir;
    this.path = `${dir}/ids.kv`;
  }

  static async create(): Promise<TempStore> {
    return new TempStore(await Deno.makeTempDir({ prefix: "idalloc-cli-" }));
  }

  /** `--store kv:<path>` plus fast knobs. */
  get args(): string[] {
    return ["--store", `kv:${this.path}`, "--poll", "50ms", "--clock-skew", "100ms"];
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await Deno.remove(this.dir, { recursive: true }).catch(() => {});
  }
}

/** A single line of stderr that names the problem and carries no stack trace. */
export function isOneLineError(stderr: string): boolean {
  const lines = stderr.trim().split("\n");
  return lines.length === 1 && lines[0].startsWith("idalloc: ") && !/\n\s+at /.test(stderr);
}
