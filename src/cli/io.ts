/**
 * Where the CLI writes: {@linkcode CliIo} (injected by tests, the process's stdout/stderr
 * otherwise), a buffered {@linkcode Output} that turns 100,000 table rows into a few large writes,
 * and a throttled {@linkcode Progress} line on stderr.
 *
 * @module
 */

/** A text sink. `write` may return a promise; the CLI awaits it (back-pressure of a pipe). */
export interface CliWriter {
  /** Writes `text` as is (the CLI adds the newlines). */
  write(text: string): void | Promise<void>;
}

/** The CLI's surroundings; everything is optional except the two writers. */
export interface CliIo {
  /** Results: tables, JSON, IDs. */
  readonly stdout: CliWriter;
  /** Errors, warnings and progress. */
  readonly stderr: CliWriter;
  /**
   * Ends `watch`, `gc --every` and `allocate --hold` (and interrupts anything else). Without it
   * the CLI listens for SIGINT and SIGTERM itself.
   */
  readonly signal?: AbortSignal;
  /** Whether stderr is a terminal (progress is shown then). @default {Deno.stderr.isTerminal()} */
  readonly stderrIsTerminal?: boolean;
}

const encoder = new TextEncoder();

/** A writer on a Deno stream that writes every byte (`write` may be partial). */
function streamWriter(stream: { write(p: Uint8Array): Promise<number> }): CliWriter {
  return {
    async write(text: string): Promise<void> {
      let bytes = encoder.encode(text);
      while (bytes.length > 0) bytes = bytes.subarray(await stream.write(bytes));
    },
  };
}

/** The process's stdout and stderr. */
export function processIo(): CliIo {
  return {
    stdout: streamWriter(Deno.stdout),
    stderr: streamWriter(Deno.stderr),
    stderrIsTerminal: Deno.stderr.isTerminal(),
  };
}

/** Bytes buffered before a write is issued. */
const FLUSH_AT = 64 * 1024;

/** Buffered, ordered writes to one {@linkcode CliWriter}. */
export class Sink {
  readonly #writer: CliWriter;
  readonly #flushAt: number;
  #buffer: string[] = [];
  #size = 0;
  #chain: Promise<void> = Promise.resolve();
  #error: unknown;

  /**
   * @param writer where the text goes
   * @param flushAt characters buffered before a write is issued (0: write at once)
   */
  constructor(writer: CliWriter, flushAt = FLUSH_AT) {
    this.#writer = writer;
    this.#flushAt = flushAt;
  }

  /** Queues `text`; it is written once enough has piled up or on {@linkcode Sink.flush}. */
  write(text: string): void {
    this.#buffer.push(text);
    this.#size += text.length;
    if (this.#size >= this.#flushAt) this.#drain();
  }

  /** Queues `text` plus a newline. */
  line(text = ""): void {
    this.write(text + "\n");
  }

  #drain(): void {
    if (this.#buffer.length === 0) return;
    const text = this.#buffer.join("");
    this.#buffer = [];
    this.#size = 0;
    // Writes stay in order; the first failure (a closed pipe) is kept and rethrown by flush().
    this.#chain = this.#chain.then(async () => {
      if (this.#error !== undefined) return;
      try {
        await this.#writer.write(text);
      } catch (err) {
        this.#error = err;
      }
    });
  }

  /** Writes everything queued and waits for it; rethrows the first write error. */
  async flush(): Promise<void> {
    this.#drain();
    await this.#chain;
    if (this.#error !== undefined) {
      const err = this.#error;
      this.#error = undefined;
      throw err;
    }
  }

  /** Like {@linkcode Sink.flush}, but never throws (for the last words of a failing run). */
  async settle(): Promise<void> {
    await this.flush().catch(() => {});
  }
}

/** Both sinks of a run. */
export class Output {
  /** Results. */
  readonly out: Sink;
  /** Errors, warnings, progress. */
  readonly err: Sink;
  /** Whether stderr is a terminal. */
  readonly terminal: boolean;

  /** @param io the writers */
  constructor(io: CliIo) {
    this.out = new Sink(io.stdout);
    // Messages and progress show up as they happen; results are batched.
    this.err = new Sink(io.stderr, 0);
    this.terminal = io.stderrIsTerminal ?? false;
  }

  /** Writes a warning line to stderr. */
  warn(message: string): void {
    this.err.line(`idalloc: ${message}`);
  }

  /** Flushes both sinks; stdout errors propagate. */
  async flush(): Promise<void> {
    await this.err.settle();
    await this.out.flush();
  }
}

/** Minimum time between two progress updates, in ms. */
const TERMINAL_EVERY_MS = 100;
/** On a non-terminal (`--progress` into a file or pipe), one line per this many ms. */
const PIPE_EVERY_MS = 1000;

/**
 * A progress line on stderr for long runs: redrawn in place on a terminal, one line per second
 * otherwise. Shown only when enabled (a terminal, or `--progress`).
 */
export class Progress {
  readonly #sink: Sink;
  readonly #enabled: boolean;
  readonly #terminal: boolean;
  #last = 0;
  #shown = false;

  /**
   * @param output the run's output
   * @param enabled whether to show anything at all
   */
  constructor(output: Output, enabled: boolean) {
    this.#sink = output.err;
    this.#enabled = enabled;
    this.#terminal = output.terminal;
  }

  /** Shows `text` unless the previous update was very recent. */
  update(text: string): void {
    if (!this.#enabled) return;
    const now = Date.now();
    if (now - this.#last < (this.#terminal ? TERMINAL_EVERY_MS : PIPE_EVERY_MS)) return;
    this.#last = now;
    this.#show(text);
  }

  #show(text: string): void {
    this.#shown = true;
    if (this.#terminal) this.#sink.write(`\r\x1b[K${text}`);
    else this.#sink.line(text);
  }

  /** Shows `text` as the final state (always, when enabled) and ends the progress line. */
  done(text: string): void {
    if (!this.#enabled) return;
    this.#show(text);
    if (this.#terminal) this.#sink.write("\n");
  }

  /** Removes the progress line (before an error message). */
  clear(): void {
    if (this.#enabled && this.#terminal && this.#shown) this.#sink.write("\r\x1b[K");
    this.#shown = false;
  }
}
