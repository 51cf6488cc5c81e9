/**
 * Drives `tests/_support/child_stall.ts`: spawns it, collects its JSON lines, stops and resumes
 * it with signals, and ends it by closing its stdin.
 */
import type { StoreSpec } from "../_support/fixture.ts";

const CHILD = new URL("../_support/child_stall.ts", import.meta.url).pathname;
const ROOT = new URL("../../", import.meta.url).pathname;

/** One JSON line the child printed (fields by `event`: held, sample, watch, status). */
export interface StallLine {
  readonly event: "held" | "sample" | "watch" | "status";
  /** held: the key's ID. */
  readonly id?: number;
  /** sample: when the calls started and ended; watch: when the event arrived. */
  readonly t0: number;
  readonly t1?: number;
  readonly t: number;
  /** sample: what `get`, `cachedId` and `allocate` answered (or an error's name). */
  readonly get?: number | string | null;
  readonly cached?: number | null;
  readonly allocate?: number | string;
  readonly fenced?: boolean;
  readonly healthy?: boolean;
  /** watch: the event. */
  readonly type?: string;
  readonly key?: string;
  readonly oldId?: number;
  readonly newId?: number;
  /** status: the fence counters at the end. */
  readonly fence?: Record<string, number>;
}

/** The stall child process (see the module doc). */
export class StallChild implements AsyncDisposable {
  /** Every line printed so far. */
  readonly lines: StallLine[] = [];
  readonly #process: Deno.ChildProcess;
  readonly #reading: Promise<void>;
  readonly #stderr: Promise<string>;
  #waiters = new Set<() => void>();
  #ended = false;

  constructor(spec: StoreSpec, node: string, key: string, max: number, leaseTtlMs: number) {
    this.#process = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CHILD, JSON.stringify(spec), node, key, String(max), String(leaseTtlMs)],
      cwd: ROOT,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#stderr = new Response(this.#process.stderr).text();
    this.#reading = this.#read();
  }

  async #read(): Promise<void> {
    let buffer = "";
    for await (const chunk of this.#process.stdout.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      const parts = buffer.split("\n");
      buffer = parts.pop()!;
      for (const part of parts) if (part.trim()) this.lines.push(JSON.parse(part));
      for (const wake of [...this.#waiters]) wake();
    }
    this.#ended = true;
    for (const wake of [...this.#waiters]) wake();
  }

  /** The first line (in order) matching `match`, waiting up to `timeoutMs` for it. */
  async next(match: (line: StallLine) => boolean, timeoutMs = 20_000): Promise<StallLine> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const found = this.lines.find(match);
      if (found) return found;
      if (this.#ended || Date.now() > end) {
        throw new Error(
          `no matching line from the stall child (${this.lines.length} lines): ` +
            (await this.#stderrNow()) + "\n" +
            this.lines.slice(-8).map((l) => JSON.stringify(l)).join("\n"),
        );
      }
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          this.#waiters.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, 100);
        this.#waiters.add(wake);
      });
    }
  }

  async #stderrNow(): Promise<string> {
    if (!this.#ended) return "(still running)";
    return await this.#stderr;
  }

  /** SIGSTOP: the process freezes, timers and all. */
  stop(): void {
    this.#process.kill("SIGSTOP");
  }

  /** SIGCONT. */
  resume(): void {
    this.#process.kill("SIGCONT");
  }

  /** Closes stdin and waits for the child's final status line and exit. */
  async finish(): Promise<StallLine> {
    await this.#process.stdin.close();
    const status = await this.#process.status;
    await this.#reading;
    if (!status.success) throw new Error(`stall child failed: ${await this.#stderr}`);
    return this.next((l) => l.event === "status", 0);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    try {
      this.#process.kill("SIGKILL");
    } catch { /* already gone */ }
    await this.#process.status;
    await this.#reading.catch(() => {});
    await this.#stderr.catch(() => {});
  }
}
