/**
 * What a command runs with: validated options, the output, the interrupt and `--timeout` signals,
 * and the store (opened on demand, closed by `main` whatever happens).
 *
 * @module
 */
import type { GlobalOptions } from "./args.ts";
import { type Output, Progress } from "./io.ts";
import { openStore, type Store } from "./store.ts";

/** Signals closer together than this are one interrupt (see {@linkcode Interrupt}), in ms. */
export const REPEAT_GAP_MS = 1_000;

/** Ends long-running commands: the caller's signal, or SIGINT/SIGTERM of this process. */
export class Interrupt implements Disposable {
  /** Aborted on interrupt. */
  readonly signal: AbortSignal;
  readonly #controller = new AbortController();
  readonly #remove: Array<() => void> = [];

  /**
   * @param external the caller's signal; without it, SIGINT and SIGTERM are listened for. The
   * first one aborts {@linkcode Interrupt.signal}; another one at least {@linkcode REPEAT_GAP_MS}
   * later exits at once with 130.
   */
  constructor(external?: AbortSignal) {
    if (external) {
      this.signal = external;
      return;
    }
    this.signal = this.#controller.signal;
    let first = 0;
    for (const name of ["SIGINT", "SIGTERM"] as const) {
      const handler = () => {
        if (!this.#controller.signal.aborted) {
          first = performance.now();
          this.#controller.abort(new DOMException(`${name} received`, "AbortError"));
          return;
        }
        // One Ctrl-C can arrive twice: `deno task` forwards the SIGINT its process group already
        // delivered to us. Only a second Ctrl-C a moment later means "now", and ends the process
        // without waiting for a graceful close that hangs.
        if (performance.now() - first >= REPEAT_GAP_MS) Deno.exit(130);
      };
      try {
        Deno.addSignalListener(name, handler);
        this.#remove.push(() => Deno.removeSignalListener(name, handler));
      } catch {
        // Not supported here (SIGTERM on Windows): Ctrl-C still ends the process.
      }
    }
  }

  /** Stops listening for signals. */
  [Symbol.dispose](): void {
    for (const remove of this.#remove.splice(0)) remove();
  }
}

/** The run of one command. */
export class RunContext implements AsyncDisposable {
  /** Validated global options. */
  readonly options: GlobalOptions;
  /** Where results and messages go. */
  readonly output: Output;
  /** Aborted on interrupt only. */
  readonly interrupt: AbortSignal;
  /** Aborted on interrupt or when `--timeout` passes (until {@linkcode RunContext.untimed}). */
  readonly signal: AbortSignal;
  readonly #deadline = new AbortController();
  readonly #stores: Store[] = [];
  #timer: ReturnType<typeof setTimeout> | undefined;

  /**
   * @param options validated global options
   * @param output the run's output
   * @param interrupt the interrupt signal
   */
  constructor(options: GlobalOptions, output: Output, interrupt: AbortSignal) {
    this.options = options;
    this.output = output;
    this.interrupt = interrupt;
    this.signal = AbortSignal.any([interrupt, this.#deadline.signal]);
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      this.#deadline.abort(new DOMException("--timeout passed", "TimeoutError"));
    }, options.timeoutMs);
  }

  /** Whether the `--timeout` deadline passed. */
  get timedOut(): boolean {
    return this.#deadline.signal.aborted;
  }

  /** Stops the `--timeout` clock: the command runs until interrupted from now on. */
  untimed(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  /** Opens the store; `create` allows a new Deno KV file. Closed when the run ends. */
  async store(create = false): Promise<Store> {
    const store = await openStore(this.options, {
      create,
      signal: this.signal,
      interrupt: this.interrupt,
    });
    this.#stores.push(store);
    return store;
  }

  /** A progress line, shown on a terminal or with `--progress`. */
  progress(): Progress {
    return new Progress(this.output, this.options.progress || this.output.terminal);
  }

  /** Stops the clock and closes the stores. */
  async [Symbol.asyncDispose](): Promise<void> {
    this.untimed();
    for (const store of this.#stores.splice(0).reverse()) await store.close();
  }
}
