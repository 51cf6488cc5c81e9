/**
 * Reads a spawned child process's stdout as text, up to a marker or to its end, while collecting
 * its stderr in the background (so neither pipe fills up and blocks the child).
 *
 * @example
 * ```ts ignore
 * // Needs the idalloc CLI as a child process; tests/cli/ runs it.
 * const child = new Deno.Command("idalloc", { args, stdout: "piped", stderr: "piped" }).spawn();
 * const output = new ChildOutput(child, "watch");
 * try {
 *   await output.until('"synced"');
 *   child.kill("SIGINT");
 *   await output.toEnd();
 * } finally {
 *   output.kill();
 * }
 * assert.equal((await child.status).code, 0, await output.stderr);
 * ```
 * @module
 */

/** A child's stdout read on demand, and its whole stderr. */
export class ChildOutput {
  /** Everything read from stdout so far. */
  text = "";
  /** All of stderr, once the child closes it. */
  readonly stderr: Promise<string>;
  readonly #child: Deno.ChildProcess;
  readonly #name: string;
  readonly #reader: ReadableStreamDefaultReader<string>;

  /**
   * Starts collecting `child`'s stderr and reading its stdout.
   *
   * @param child spawned with `stdout: "piped"` and `stderr: "piped"`
   * @param name names the child in the error thrown when it exits too early
   */
  constructor(child: Deno.ChildProcess, name: string) {
    this.#child = child;
    this.#name = name;
    this.stderr = new Response(child.stderr).text();
    this.#reader = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  }

  /** Reads until stdout contains `marker`; throws (with stdout and stderr) if it ends first. */
  async until(marker: string): Promise<void> {
    while (!this.text.includes(marker)) {
      const { value, done } = await this.#reader.read();
      if (done) throw new Error(`${this.#name} exited early: ${this.text}\n${await this.stderr}`);
      this.text += value;
    }
  }

  /** Reads stdout to its end (after the child was told to stop). */
  async toEnd(): Promise<void> {
    for (;;) {
      const { value, done } = await this.#reader.read();
      if (done) return;
      this.text += value;
    }
  }

  /** SIGKILLs the child unless it has exited (in `finally`: a failed test must not hang). */
  kill(): void {
    try {
      this.#child.kill("SIGKILL");
    } catch {
      // already exited
    }
  }
}
