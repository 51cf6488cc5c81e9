/**
 * A nemesis child process as the orchestrator sees it: spawned with its JSON configuration,
 * commands written to its stdin, acknowledgements read from its stdout, its stderr (idalloc's
 * log) copied to a file, and signals (SIGKILL, SIGSTOP, SIGCONT) sent by PID. Foreign programs
 * (the Cilium nodes of `cilium.ts`) are spawned the same way with {@linkcode Child.exec}, their
 * stdout handed line by line to a callback.
 *
 * @module
 */

const ROOT = new URL("../", import.meta.url).pathname;

/**
 * How long a process of the run may take to start (a worker, the GC loop, a Cilium node): its
 * connect is retried through store faults for up to 60 s (`startWhenReachable`), on a machine
 * that may be loaded far past its cores — at load 61 a worker was not ready within 60 s and
 * failed the harness (seed 2 of the second mixed Kubernetes runs).
 */
export const START_BOUND_MS = 180_000;

/** The signals the orchestrator sends (SIGUSR1/SIGUSR2 pause and resume a Cilium worker). */
export type ChildSignal = "SIGKILL" | "SIGSTOP" | "SIGCONT" | "SIGTERM" | "SIGUSR1" | "SIGUSR2";

/** One child process. */
export class Child implements AsyncDisposable {
  /** Every child not known to have exited, for {@linkcode Child.killAll}. */
  static readonly #running = new Set<Child>();

  /** A name for messages. */
  readonly name: string;
  readonly #process: Deno.ChildProcess;
  readonly #stdin: WritableStreamDefaultWriter<Uint8Array>;
  readonly #lines: string[] = [];
  #waiters: Array<() => void> = [];
  #closed = false;
  readonly #stderrDone: Promise<void>;
  readonly #stdoutDone: Promise<void>;

  /** When set, every stdout line goes here instead of the buffer {@linkcode waitFor} reads. */
  readonly #onLine?: (line: string) => void;

  private constructor(
    name: string,
    process: Deno.ChildProcess,
    stderrFile: Deno.FsFile,
    onLine?: (line: string) => void,
  ) {
    this.name = name;
    this.#process = process;
    this.#onLine = onLine;
    this.#stdin = process.stdin.getWriter();
    this.#stderrDone = process.stderr.pipeTo(stderrFile.writable).catch(() => {});
    this.#stdoutDone = this.#readStdout();
    Child.#running.add(this);
    process.status.finally(() => Child.#running.delete(this));
  }

  /**
   * SIGKILLs every child still running (after SIGCONT, so a stopped one dies too), without waiting:
   * for an interrupted orchestrator, whose children would otherwise outlive it (a worker does not
   * always end when its stdin closes).
   */
  static killAll(): void {
    for (const child of Child.#running) {
      child.signal("SIGCONT");
      child.signal("SIGKILL");
    }
  }

  /**
   * Spawns `deno run -A <script> <config JSON>` from the repository root.
   *
   * @param script path relative to the repository root
   * @param stderrPath file receiving the child's stderr
   * @param v8Flags extra V8 flags (e.g. `--expose-gc`)
   */
  static async spawn(
    name: string,
    script: string,
    config: unknown,
    stderrPath: string,
    v8Flags: readonly string[] = [],
  ): Promise<Child> {
    const args = ["run", "-A"];
    if (v8Flags.length > 0) args.push(`--v8-flags=${v8Flags.join(",")}`);
    args.push(script, JSON.stringify(config));
    return await Child.exec(name, Deno.execPath(), args, stderrPath);
  }

  /**
   * Spawns any `program` with `args` from the repository root. With `onLine`, each stdout line is
   * handed to it as it arrives and not kept (a long-running program's output would otherwise
   * pile up); such a child is not read with {@linkcode waitFor}.
   */
  static async exec(
    name: string,
    program: string,
    args: readonly string[],
    stderrPath: string,
    onLine?: (line: string) => void,
  ): Promise<Child> {
    const stderrFile = await Deno.open(stderrPath, { write: true, create: true, append: true });
    const process = new Deno.Command(program, {
      args: [...args],
      cwd: ROOT,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    return new Child(name, process, stderrFile, onLine);
  }

  /** The process ID. */
  get pid(): number {
    return this.#process.pid;
  }

  /** Resolves with the exit status. */
  get status(): Promise<Deno.CommandStatus> {
    return this.#process.status;
  }

  async #readStdout(): Promise<void> {
    let buffer = "";
    try {
      for await (const chunk of this.#process.stdout.pipeThrough(new TextDecoderStream())) {
        buffer += chunk;
        let newline;
        while ((newline = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, newline).trim();
          if (this.#onLine) this.#onLine(line);
          else this.#lines.push(line);
          buffer = buffer.slice(newline + 1);
        }
        this.#wake();
      }
    } finally {
      this.#closed = true;
      this.#wake();
    }
  }

  #wake(): void {
    const waiters = this.#waiters;
    this.#waiters = [];
    for (const w of waiters) w();
  }

  /**
   * Waits until the child printed `line` (consuming it and everything before it); throws if its
   * stdout ends first or `timeoutMs` passes.
   */
  async waitFor(line: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const at = this.#lines.indexOf(line);
      if (at >= 0) {
        this.#lines.splice(0, at + 1);
        return;
      }
      if (this.#closed) throw new Error(`${this.name} exited before printing '${line}'`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`${this.name} did not print '${line}' within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.#waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Writes one command line to the child's stdin (ignored once it exited). */
  async send(command: string): Promise<void> {
    try {
      await this.#stdin.write(new TextEncoder().encode(command + "\n"));
    } catch {
      // The child is gone; its absence is handled by whoever waits for its answer.
    }
  }

  /** Sends `signal` to the child; false if it is gone. */
  signal(signal: ChildSignal): boolean {
    try {
      this.#process.kill(signal);
    } catch {
      return false;
    }
    return true;
  }

  /** SIGKILLs the child (after SIGCONT, so a stopped child dies too) and waits for it. */
  async kill(): Promise<void> {
    this.signal("SIGCONT");
    this.signal("SIGKILL");
    await this.#process.status;
  }

  /** Waits for the child's pipes to drain after it exited. */
  async settled(): Promise<void> {
    await this.#process.status;
    await this.#stdin.close().catch(() => {});
    await Promise.all([this.#stdoutDone.catch(() => {}), this.#stderrDone]);
  }

  /** Kills the child unless it exited, and releases its pipes. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
    await this.settled();
  }
}
