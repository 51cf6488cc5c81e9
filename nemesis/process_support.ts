/**
 * What every nemesis child process (worker, GC loop, growth run) shares: opening its backend from
 * a {@linkcode NemesisStoreSpec}, sending idalloc's log to stderr (a child is an application, so it may
 * configure LogTape), and reading commands from stdin.
 *
 * @module
 */
import { configure, getTextFormatter, type LogLevel } from "@logtape/logtape";
import { loadNemesisHooks } from "./composed.ts";
import { IdallocError } from "../src/errors.ts";
import { sleep } from "../src/abort.ts";
import type {
  NemesisStore,
  NemesisStoreSpec,
  OpenBackendExtra,
  OpenedBackend,
} from "../src/testing/nemesis.ts";

/**
 * Opens `node`'s backend on the store `spec` names, through the harness of the spec's kind (a
 * child process loads only its own backend's; a composed store's loads its sides').
 */
export async function openBackend(
  spec: NemesisStoreSpec,
  node: string,
  extra: OpenBackendExtra = {},
): Promise<OpenedBackend> {
  return await (await loadNemesisHooks(spec.kind)).openBackend(spec, node, extra);
}

/** Opens the store `spec` names for reading, through the harness of the spec's kind. */
export async function openStore(spec: NemesisStoreSpec): Promise<NemesisStore> {
  return await (await loadNemesisHooks(spec.kind)).openStore(spec);
}

/**
 * Runs `start` (connecting, opening an allocator) until it succeeds or fails for good, as a
 * supervisor restarts a node: a node restarted while the whole etcd cluster is down (overlapping
 * faults) gets a refused connection, which `EtcdBackend.connect` reports at once, by design.
 * Retryable failures are tried again for up to `withinMs`.
 */
export async function startWhenReachable<T>(
  start: () => Promise<T>,
  withinMs = 60_000,
): Promise<T> {
  const until = Date.now() + withinMs;
  for (;;) {
    try {
      return await start();
    } catch (err) {
      if (!(err instanceof IdallocError && err.retryable) || Date.now() > until) throw err;
      await sleep(250);
    }
  }
}

/** Sends idalloc's log records at `level` and above to stderr, one synchronous write each. */
export async function logToStderr(level: LogLevel): Promise<void> {
  const format = getTextFormatter();
  const encoder = new TextEncoder();
  await configure({
    sinks: { stderr: (record) => void Deno.stderr.writeSync(encoder.encode(format(record))) },
    loggers: [
      { category: ["idalloc"], lowestLevel: level, sinks: ["stderr"] },
      { category: ["logtape", "meta"], lowestLevel: "warning", sinks: [] },
    ],
  });
}

/** The lines arriving on stdin, until it closes. */
export async function* stdinLines(): AsyncGenerator<string> {
  let buffer = "";
  for await (const chunk of Deno.stdin.readable.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let newline;
    while ((newline = buffer.indexOf("\n")) >= 0) {
      const line = buffer.slice(0, newline).trim();
      buffer = buffer.slice(newline + 1);
      if (line !== "") yield line;
    }
  }
}

/** Parses the process's only argument as JSON with `schema`; exits 2 on a bad argument. */
export function configFromArgs<T>(schema: { parse(input: unknown): T }): T {
  try {
    return schema.parse(JSON.parse(Deno.args[0] ?? ""));
  } catch (err) {
    console.error(`bad configuration argument: ${err}`);
    Deno.exit(2);
  }
}
