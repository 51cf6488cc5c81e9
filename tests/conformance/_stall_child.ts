/**
 * Drives `tests/_support/child_stall.ts`: spawns it, collects its JSON lines, stops and resumes
 * it with signals, and ends it by closing its stdin.
 */
import type { StoreSpec } from "../../src/testing/fixture.ts";
import { ScriptProcess } from "../_support/script_process.ts";

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
  readonly #process: ScriptProcess;
  readonly #parsed: StallLine[] = [];

  constructor(spec: StoreSpec, node: string, key: string, max: number, leaseTtlMs: number) {
    this.#process = new ScriptProcess(
      CHILD,
      [JSON.stringify(spec), node, key, String(max), String(leaseTtlMs)],
      { cwd: ROOT, stdin: true },
    );
  }

  /** Every line printed so far. */
  get lines(): readonly StallLine[] {
    const raw = this.#process.lines;
    for (let i = this.#parsed.length; i < raw.length; i++) this.#parsed.push(JSON.parse(raw[i]));
    return this.#parsed;
  }

  /** The first line (in order) matching `match`, waiting up to `timeoutMs` for it. */
  async next(match: (line: StallLine) => boolean, timeoutMs = 20_000): Promise<StallLine> {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const found = this.lines.find(match);
      if (found) return found;
      if (this.#process.ended || Date.now() > end) {
        throw new Error(
          `no matching line from the stall child (${this.lines.length} lines): ` +
            (this.#process.ended ? this.#process.stderr : "(still running)") + "\n" +
            this.lines.slice(-8).map((l) => JSON.stringify(l)).join("\n"),
        );
      }
      await this.#process.changed(100);
    }
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
    this.#process.closeStdin();
    await this.#process.success("stall child");
    return this.next((l) => l.event === "status", 0);
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.#process[Symbol.asyncDispose]();
  }
}
