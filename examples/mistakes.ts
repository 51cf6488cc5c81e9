/**
 * How the examples end on an ordinary mistake — a bad argument or environment variable, a store
 * that cannot be reached or opened, a port in use: one line on stderr and exit code 1, never a
 * stack trace. Anything else is a bug and keeps Deno's report with its stack trace.
 *
 * ```ts ignore
 * exitOnMistakes("quickstart");
 * using kv = await openKvFile(Deno.args[0] ?? "./quickstart.kv", "the first argument");
 * ```
 *
 * @module
 */
import { IdallocError } from "@idalloc/idalloc";
import { callerPath } from "../src/caller_path.ts";

/** A mistake in how an example was started or what it was pointed at, said in plain words. */
export class ExampleError extends Error {
  /** Creates the error. */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "ExampleError";
  }
}

/**
 * The one line that tells an ordinary mistake, or `undefined` for anything else (a bug). idalloc's
 * own errors say what is wrong in their message (bad options, store unavailable, access denied).
 */
export function mistakeLine(err: unknown): string | undefined {
  if (!(err instanceof ExampleError || err instanceof IdallocError)) return undefined;
  return err.message.split("\n").map((l) => l.trim()).filter((l) => l !== "").join("; ");
}

/**
 * Makes an ordinary mistake that nothing caught end the example `name`: `name: <what is wrong>` on
 * stderr, exit code 1. Call it first thing in an example's main module.
 */
export function exitOnMistakes(name: string): void {
  const handle = (event: Event, err: unknown) => {
    const line = mistakeLine(err);
    if (line === undefined) return;
    event.preventDefault();
    console.error(`${name}: ${line}`);
    Deno.exit(1);
  };
  // A top-level `await` that rejects arrives as an unhandled rejection; a synchronous throw as an
  // error event.
  globalThis.addEventListener("unhandledrejection", (e) => handle(e, e.reason));
  globalThis.addEventListener("error", (e) => handle(e, e.error));
}

/**
 * Opens the Deno KV file `given`, which the user gave as `source` (an argument, a variable): a
 * path in a missing directory, a directory or a file that is not a KV store is an
 * {@linkcode ExampleError} naming both. A relative path names a file in the caller's directory,
 * under `deno task` too (which runs in the repository), as the CLI's `--store kv:<file>` does.
 */
export async function openKvFile(given: string, source: string): Promise<Deno.Kv> {
  const path = callerPath(given);
  try {
    return await Deno.openKv(path);
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new ExampleError(`cannot open Deno KV file ${path} (${source}): ${why}`, { cause: err });
  }
}
