import type { StoreSpec } from "../_support/fixture.ts";

const CHILD = new URL("../_support/child_allocate.ts", import.meta.url).pathname;
const ROOT = new URL("../../", import.meta.url).pathname;

/** A node allocating `count` keys in a separate Deno process. */
export class ChildNode implements AsyncDisposable {
  readonly #process: Deno.ChildProcess;
  readonly #lines: ReadableStreamDefaultReader<string>;
  readonly #stderr: Promise<string>;

  constructor(spec: StoreSpec, node: string, max: number, count: number, hold = false) {
    this.#process = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", CHILD, JSON.stringify(spec), node, String(max), String(count)].concat(
        hold ? ["hold"] : [],
      ),
      cwd: ROOT,
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#lines = this.#process.stdout
      .pipeThrough(new TextDecoderStream())
      .pipeThrough(lineSplitter())
      .getReader();
    this.#stderr = new Response(this.#process.stderr).text();
  }

  /** The `{key: id}` map the child printed. */
  async ids(): Promise<Record<string, number>> {
    const { value, done } = await this.#lines.read();
    if (done) throw new Error(`child exited without output: ${await this.#stderr}`);
    return JSON.parse(value);
  }

  /** Kills the child at once (SIGKILL: no cleanup, its lease just stops being renewed). */
  async kill(): Promise<void> {
    try {
      this.#process.kill("SIGKILL");
    } catch { /* already gone */ }
    await this.#process.status;
  }

  /** Waits for a normal exit; throws with stderr if it failed. */
  async done(): Promise<void> {
    const status = await this.#process.status;
    if (!status.success) throw new Error(`child failed (${status.code}): ${await this.#stderr}`);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.kill();
    await this.#lines.cancel().catch(() => {});
    await this.#stderr.catch(() => {});
  }
}

function lineSplitter(): TransformStream<string, string> {
  let buffer = "";
  return new TransformStream({
    transform(chunk, controller) {
      buffer += chunk;
      const lines = buffer.split("\n");
      buffer = lines.pop()!;
      for (const line of lines) if (line.trim()) controller.enqueue(line);
    },
    flush(controller) {
      if (buffer.trim()) controller.enqueue(buffer);
    },
  });
}
