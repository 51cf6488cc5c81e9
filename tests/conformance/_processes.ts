import type { StoreSpec } from "../../src/testing/fixture.ts";
import { ScriptProcess } from "../_support/script_process.ts";

const CHILD = new URL("../_support/child_allocate.ts", import.meta.url).pathname;
const ROOT = new URL("../../", import.meta.url).pathname;

/** A node allocating `count` keys in a separate process (on the runtime running the tests). */
export class ChildNode implements AsyncDisposable {
  readonly #process: ScriptProcess;

  constructor(spec: StoreSpec, node: string, max: number, count: number, hold = false) {
    this.#process = new ScriptProcess(
      CHILD,
      [JSON.stringify(spec), node, String(max), String(count)].concat(hold ? ["hold"] : []),
      { cwd: ROOT },
    );
  }

  /** The `{key: id}` map the child printed. */
  async ids(): Promise<Record<string, number>> {
    const line = await this.#process.nextLine();
    if (line === undefined) throw new Error(`child exited without output: ${this.#process.stderr}`);
    return JSON.parse(line);
  }

  /** Kills the child at once (SIGKILL: no cleanup, its lease just stops being renewed). */
  async kill(): Promise<void> {
    this.#process.kill("SIGKILL");
    await this.#process.exited;
  }

  /** Waits for a normal exit; throws with stderr if it failed. */
  done(): Promise<void> {
    return this.#process.success("child");
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.#process[Symbol.asyncDispose]();
  }
}
