/**
 * The byte stream of one watch, as the client reads it: the caller's signal linked to a deadline
 * (the request timeout until the answer's head arrives, then an optional idle timeout that
 * restarts with every chunk), and the split of the chunks into lines (one JSON event each).
 * Aborting the stream's signal also aborts the HTTP request, so a stalled body cannot outlive it.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { WatchStream } from "./client_watch.ts";
 *
 * async function* chunks() {
 *   yield new TextEncoder().encode('{"type":"ADDED"}\n{"type":');
 *   yield new TextEncoder().encode('"DELETED"}\n');
 * }
 * const stream = new WatchStream(undefined, 1000, undefined);
 * stream.headReceived();
 * const lines = [];
 * for await (const line of stream.lines(chunks())) lines.push(JSON.parse(line).type);
 * stream.dispose();
 * assert.deepEqual(lines, ["ADDED", "DELETED"]);
 * ```
 *
 * @module
 */
import { StoreUnavailableError } from "../../errors.ts";

/**
 * The state of one watch's stream: the caller's signal linked to an idle deadline that restarts
 * with every chunk, and the split of chunks into lines.
 */
export class WatchStream {
  readonly #controller = new AbortController();
  readonly #caller: AbortSignal | undefined;
  readonly #idleMs: number | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  /** The error that ended the stream for silence (or a late head), if that happened. */
  idle: StoreUnavailableError | undefined;
  readonly #onAbort = () => this.#controller.abort(this.#caller!.reason);

  constructor(caller: AbortSignal | undefined, headMs: number, idleMs: number | undefined) {
    this.#caller = caller;
    this.#idleMs = idleMs;
    caller?.addEventListener("abort", this.#onAbort, { once: true });
    this.#arm(headMs, `the watch got no answer within ${headMs} ms`);
  }

  /** The answer's head arrived: from now on only silence longer than the idle timeout fails. */
  headReceived(): void {
    clearTimeout(this.#timer);
    this.#arm(this.#idleMs);
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  get aborted(): boolean {
    return this.#caller?.aborted === true;
  }

  #arm(ms: number | undefined, message?: string): void {
    if (ms === undefined) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      this.idle = new StoreUnavailableError(
        message ??
          `the watch got no data for ${ms} ms: the API server is stalled or the connection is gone`,
      );
      this.#controller.abort(this.idle);
    }, ms);
  }

  /** The lines of `chunks`; ends (or throws) when the stream's signal aborts. */
  async *lines(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<string> {
    const decoder = new TextDecoder();
    let buffer = "";
    const iterator = chunks[Symbol.asyncIterator]();
    try {
      for (;;) {
        const next = await this.#read(iterator);
        if (next.done) break;
        this.#arm(this.#idleMs);
        buffer += decoder.decode(next.value, { stream: true });
        let at: number;
        while ((at = buffer.indexOf("\n")) >= 0) {
          const line = buffer.slice(0, at).trim();
          buffer = buffer.slice(at + 1);
          if (line !== "") yield line;
        }
      }
      const rest = (buffer + decoder.decode()).trim();
      if (rest !== "") yield rest;
    } finally {
      await iterator.return?.();
    }
  }

  /**
   * The next chunk, or the stream signal's reason once it aborts: a stalled body must not outlive
   * an abort. One listener per read, removed when the read settles — never a race against one
   * long-lived promise, whose reactions would keep every chunk read alive until the stream ends.
   */
  #read(iterator: AsyncIterator<Uint8Array>): Promise<IteratorResult<Uint8Array>> {
    const signal = this.#controller.signal;
    if (signal.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const onAbort = () => reject(signal.reason);
      signal.addEventListener("abort", onAbort, { once: true });
      iterator.next().then(resolve, reject).finally(() => {
        signal.removeEventListener("abort", onAbort);
      });
    });
  }

  dispose(): void {
    clearTimeout(this.#timer);
    this.#caller?.removeEventListener("abort", this.#onAbort);
    if (!this.#controller.signal.aborted) this.#controller.abort();
  }
}
