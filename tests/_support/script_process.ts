/**
 * A repository script running in a child process on the same runtime as the tests (see
 * `runtime.ts`): its stdout as lines, its stderr as text, signals, and its exit. `node:` APIs
 * only, so the suites that spawn nodes run on Deno, Node.js and Bun alike.
 *
 * @example
 * ```ts ignore
 * await using child = new ScriptProcess(CHILD, [spec, "node-b"], { cwd: ROOT });
 * const first = await child.nextLine();
 * ```
 * @module
 */
import { type ChildProcess, spawn } from "node:child_process";
import process from "node:process";
import { scriptCommand } from "../../src/testing/runtime.ts";

/** How a child ended: its exit code, or the signal that ended it. */
export interface ScriptExit {
  readonly code: number | null;
  readonly signal: string | null;
}

/** Options of {@linkcode ScriptProcess}. */
export interface ScriptProcessOptions {
  /** Working directory of the child. */
  readonly cwd?: string;
  /** Keep stdin open as a pipe (closed by {@linkcode ScriptProcess.closeStdin}). */
  readonly stdin?: boolean;
  /** Environment variables added to this process's. */
  readonly env?: Readonly<Record<string, string>>;
}

/** The child process (see the module doc). */
export class ScriptProcess implements AsyncDisposable {
  /** Every non-empty stdout line so far. */
  readonly lines: string[] = [];
  /** Resolves when the child has exited and its pipes are closed. */
  readonly exited: Promise<ScriptExit>;
  readonly #child: ChildProcess;
  #stderr = "";
  #partial = "";
  #waiters = new Set<() => void>();
  #read = 0;
  #done = false;

  constructor(path: string, args: readonly string[], options: ScriptProcessOptions = {}) {
    const [command, argv] = scriptCommand(path, args);
    this.#child = spawn(command, argv, {
      cwd: options.cwd,
      env: { ...process.env, ...options.env },
      stdio: [options.stdin ? "pipe" : "ignore", "pipe", "pipe"],
    });
    this.#child.stdout!.setEncoding("utf8");
    this.#child.stdout!.on("data", (chunk: string) => {
      const parts = (this.#partial + chunk).split("\n");
      this.#partial = parts.pop()!;
      for (const part of parts) if (part.trim()) this.lines.push(part);
      this.#wake();
    });
    this.#child.stderr!.setEncoding("utf8");
    this.#child.stderr!.on("data", (chunk: string) => (this.#stderr += chunk));
    this.exited = new Promise((resolve) => {
      this.#child.once("close", (code, signal) => {
        if (this.#partial.trim()) this.lines.push(this.#partial);
        this.#partial = "";
        this.#done = true;
        resolve({ code, signal });
        this.#wake();
      });
    });
  }

  /** Whether the child has exited and its output is all in {@linkcode ScriptProcess.lines}. */
  get ended(): boolean {
    return this.#done;
  }

  /** What the child wrote to stderr so far. */
  get stderr(): string {
    return this.#stderr;
  }

  /** The next stdout line not yet taken, or `undefined` once the child has exited without one. */
  async nextLine(): Promise<string | undefined> {
    while (this.#read >= this.lines.length) {
      if (this.#done) return undefined;
      await this.changed();
    }
    return this.lines[this.#read++];
  }

  /** Resolves at the next stdout line or exit, or after `timeoutMs`. */
  changed(timeoutMs = 1_000): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#waiters.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, timeoutMs);
      this.#waiters.add(wake);
    });
  }

  /** Sends `signal`; a child that is gone already is not an error. */
  kill(signal: "SIGKILL" | "SIGTERM" | "SIGSTOP" | "SIGCONT"): void {
    if (this.#done || this.#child.pid === undefined) return;
    try {
      // By PID: Deno's `ChildProcess.kill` sends one signal per child and ignores later ones,
      // so a SIGCONT after a SIGSTOP would never arrive.
      process.kill(this.#child.pid, signal);
    } catch {
      // already gone
    }
  }

  /** Writes `line` and a newline to the child's stdin (it was started with `stdin: true`). */
  writeLine(line: string): void {
    this.#child.stdin?.write(`${line}\n`);
  }

  /** Closes the child's stdin (it was started with `stdin: true`). */
  closeStdin(): void {
    this.#child.stdin?.end();
  }

  /** Waits for exit; throws with stderr unless it exited with code 0. */
  async success(what: string): Promise<void> {
    const { code, signal } = await this.exited;
    if (code !== 0) throw new Error(`${what} failed (${code ?? signal}): ${this.#stderr}`);
  }

  /** SIGKILLs the child (unless it is gone) and waits until it has exited. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (!this.#done) this.kill("SIGKILL");
    await this.exited;
  }

  #wake(): void {
    for (const wake of [...this.#waiters]) wake();
  }
}
