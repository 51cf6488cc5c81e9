import type { StoreSpec } from "../../src/testing/fixture.ts";
import { ScriptProcess } from "../_support/script_process.ts";

const CHILD = new URL("../_support/child_allocate.ts", import.meta.url).pathname;
const ROOT = new URL("../../", import.meta.url).pathname;

/** A node allocating `count` keys in a separate process (on the runtime running the tests). */
export class ChildNode implements AsyncDisposable {
  readonly #process: ScriptProcess;

  /**
   * @param leaseTtlMs the child's lease: short where a test waits for it to lapse, long where a
   *   lapse on a starved machine would void the answers a test compares
   */
  constructor(
    spec: StoreSpec,
    node: string,
    max: number,
    count: number,
    options: { readonly hold?: boolean; readonly leaseTtlMs: number },
  ) {
    const args = [
      JSON.stringify(spec),
      node,
      String(max),
      String(count),
      String(options.leaseTtlMs),
    ];
    this.#process = new ScriptProcess(CHILD, args.concat(options.hold ? ["hold"] : []), {
      cwd: ROOT,
    });
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
