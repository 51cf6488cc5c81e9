/**
 * The `idalloc` command line: allocate, look up, list, watch and garbage-collect cluster-wide IDs
 * in a Deno KV file or in etcd (Cilium's layout), and Cilium-style security identities.
 *
 * ```sh
 * deno task idalloc allocate 'app=web;'            # ID 16352 for app=web; (created)
 * deno task idalloc get 'app=web;'                 # 16352
 * deno task idalloc list                           # a table; --json for scripts
 * deno task idalloc watch                          # JSON lines until Ctrl-C
 * deno task idalloc gc --every 15m                 # like Cilium's operator
 * deno task idalloc --store etcd://127.0.0.1:2379 status
 * deno task idalloc identity allocate k8s:app=web k8s:io.kubernetes.pod.namespace=prod
 * ```
 *
 * `--help` works on every command. Errors are one line on stderr and an exit code
 * ({@linkcode ExitCode}): 0 ok, 1 usage, 2 store unavailable, 3 not found, 4 refused by the store,
 * 5 internal, 130 interrupted.
 *
 * The CLI runs in-process too: {@linkcode main} takes the arguments and the writers and resolves to
 * the exit code, after closing everything it opened.
 *
 * @example Run a command in-process and capture its output
 * ```ts
 * import assert from "node:assert/strict";
 * import { main } from "@idalloc/idalloc/cli";
 *
 * const dir = await Deno.makeTempDir();
 * let out = "";
 * const code = await main(["--store", `kv:${dir}/ids.kv`, "allocate", "app=web;", "--json"], {
 *   stdout: { write: (text) => void (out += text) },
 *   stderr: { write: () => {} },
 * });
 * assert.equal(code, 0);
 * assert.equal(typeof JSON.parse(out).id, "number");
 * await Deno.remove(dir, { recursive: true });
 * ```
 *
 * @module
 */
import { configure, getTextFormatter, reset } from "../deps/logtape.ts";
import { classify, errorLine, ExitCode } from "./exit.ts";
import { InvalidOptionsError } from "../errors.ts";
import { type CliIo, Output, processIo } from "./io.ts";
import { Interrupt, RunContext } from "./context.ts";
import { parseCommandLine } from "./program.ts";

export { ExitCode, type ExitCodes } from "./exit.ts";
export type { CliIo, CliWriter } from "./io.ts";

async function withLogging<T>(
  enabled: boolean,
  output: Output,
  fn: () => Promise<T>,
): Promise<T> {
  if (!enabled) return await fn();
  const format = getTextFormatter();
  try {
    // The CLI is the application here, so it may configure LogTape (the library never does).
    await configure({
      sinks: { stderr: (record) => output.err.write(format(record)) },
      loggers: [
        { category: ["idalloc"], lowestLevel: "info", sinks: ["stderr"] },
        { category: ["logtape", "meta"], lowestLevel: "warning", sinks: [] },
      ],
    });
  } catch (err) {
    output.warn(`--verbose ignored: logging is configured already (${err})`);
    return await fn();
  }
  try {
    return await fn();
  } finally {
    await reset();
  }
}

/**
 * Runs the CLI with `args` (without the program name) and resolves to the exit code. Everything it
 * opens (stores, allocators, signal listeners, timers) is closed before it resolves.
 *
 * @param args the command line, e.g. `["list", "--json"]`
 * @param io where output goes; the process's stdout/stderr, and SIGINT/SIGTERM, by default
 * @returns the exit code ({@linkcode ExitCode})
 */
export async function main(args: string[], io: CliIo = processIo()): Promise<number> {
  const output = new Output(io);
  using interrupt = new Interrupt(io.signal);
  let debug = args.includes("--debug");
  const json = args.includes("--json");
  let code: number;
  let ctx: RunContext | undefined;
  try {
    checkArguments(args);
    const parsed = await parseCommandLine(args, output, json);
    if (parsed.kind === "exit") {
      code = parsed.code;
    } else {
      const { options, run } = parsed.command;
      debug = options.debug;
      const context = new RunContext(options, output, interrupt.signal);
      ctx = context;
      try {
        code = await withLogging(options.verbose, output, () => run(context));
      } finally {
        await context[Symbol.asyncDispose]();
      }
    }
    await output.flush();
  } catch (err) {
    const failure = classify(err, {
      interrupted: interrupt.signal.aborted,
      timedOut: ctx?.timedOut ? formatTimeout(ctx) : undefined,
      driver: ctx?.options.backend.driver,
    });
    code = failure.code;
    if (failure.message !== "") {
      output.err.line(errorLine(json, failure.code, nameOf(err), failure.message));
    }
    if (debug && failure.code === ExitCode.Internal && err instanceof Error && err.stack) {
      output.err.line(err.stack);
    } else if (debug) {
      for (let cause = (err as Error)?.cause; cause !== undefined; cause = (cause as Error).cause) {
        output.err.line(`  caused by: ${cause instanceof Error ? cause.message : String(cause)}`);
      }
    }
    await output.out.settle();
    await output.err.settle();
  }
  return code;
}

/**
 * Refuses an argument holding U+FFFD, the replacement character: Deno (and `deno task`, which
 * passes arguments on) decodes bytes that are not UTF-8 into it, so `$'bad\xc3'` and `$'bad\xc4'`
 * would arrive as the same key and share an ID.
 */
function checkArguments(args: readonly string[]): void {
  const bad = args.findIndex((a) => a.includes("\uFFFD"));
  if (bad < 0) return;
  throw new InvalidOptionsError(
    `argument ${bad + 1} (${
      JSON.stringify(args[bad])
    }) is not valid UTF-8 text: it holds U+FFFD, ` +
      "which stands for bytes that could not be decoded (two such keys would share an ID)",
  );
}

function nameOf(err: unknown): string {
  return err instanceof Error ? err.name : "Error";
}

function formatTimeout(ctx: RunContext): string {
  const ms = ctx.options.timeoutMs;
  return ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

if (import.meta.main) Deno.exit(await main(Deno.args));
