/**
 * The CLI's exit codes and how an error becomes one line on stderr and one of them. Errors are
 * told apart by their stable `name` (idalloc's error classes), never by message text.
 *
 * @module
 */
import type { BackendDriver, DriverFailure } from "../backends/driver.ts";
import { BACKENDS } from "../backends/registry.ts";
import { errorMessage } from "../errors.ts";

/** The exit codes of the `idalloc` CLI. */
export interface ExitCodes {
  /** The command did what was asked. */
  readonly Ok: 0;
  /**
   * Bad command line or input: an unknown command or option, an invalid key, ID, label or
   * duration, a prefix under which nothing is stored, a missing KV file; and setup mistakes that
   * retrying cannot fix: credentials etcd denies (or an etcd without authentication), TLS that
   * does not fit the server, an endpoint that is not etcd.
   */
  readonly Usage: 1;
  /**
   * The store could not be reached (host name not resolvable, connection refused, no answer
   * within `--connect-timeout`) or opened, or did not answer within `--timeout`.
   */
  readonly Unavailable: 2;
  /** `get`, `get-id` or `release`: the key or ID has no entry in the store. */
  readonly NotFound: 3;
  /**
   * The store refused: no free ID left, allocation failed after its retries, a corrupt entry, a
   * `--node` whose lease is live, or another error the store reported. (Wrong credentials or
   * permissions are usage errors, 1.)
   */
  readonly Refused: 4;
  /** An unexpected failure (a bug); `--debug` prints the stack trace. */
  readonly Internal: 5;
  /** Interrupted (Ctrl-C, SIGTERM) before a one-shot command finished. */
  readonly Interrupted: 130;
}

/** The exit codes of the `idalloc` CLI, by name. */
export const ExitCode: ExitCodes = {
  Ok: 0,
  Usage: 1,
  Unavailable: 2,
  NotFound: 3,
  Refused: 4,
  Internal: 5,
  Interrupted: 130,
};

/**
 * One error line as the CLI prints it: `idalloc: <message>`, or with `--json` one JSON object
 * `{"error": {"code", "name", "message"}}`.
 */
export function errorLine(json: boolean, code: number, name: string, message: string): string {
  return json ? JSON.stringify({ error: { code, name, message } }) : `idalloc: ${message}`;
}

/** What the CLI prints and returns for an error. */
export interface Failure {
  /** The exit code. */
  readonly code: number;
  /** One line, without the `idalloc: ` prefix. */
  readonly message: string;
}

/** Exit codes of the core error classes (`src/errors.ts`); backends add theirs (below). */
const CORE_BY_NAME: Readonly<Record<string, number>> = {
  InvalidOptionsError: ExitCode.Usage,
  InvalidKeyError: ExitCode.Usage,
  InvalidIdError: ExitCode.Usage,
  LabelError: ExitCode.Usage,
  ReadOnlyError: ExitCode.Usage,
  StoreUnavailableError: ExitCode.Unavailable,
  PoolExhaustedError: ExitCode.Refused,
  ConflictError: ExitCode.Refused,
  CorruptEntryError: ExitCode.Refused,
  AllocationFailedError: ExitCode.Refused,
  KeyNotHeldError: ExitCode.NotFound,
  // A writable session under a node name whose lease is live (another process, or a run that
  // exited within its lease TTL): refused, as `gc --node` and `release --node` refuse.
  NodeInUseError: ExitCode.Refused,
  // The base class: a failure the store reported that has no class of its own. The store
  // answered, so it is not "down".
  IdallocError: ExitCode.Refused,
};

/** Each backend's own error classes, by name, as its driver declares them. */
const BACKEND_FAILURES: ReadonlyMap<string, DriverFailure> = new Map(
  BACKENDS.flatMap((d) => Object.entries(d.failures)),
);

const CODE_OF_KIND: Readonly<Record<DriverFailure["kind"], number>> = {
  usage: ExitCode.Usage,
  unavailable: ExitCode.Unavailable,
};

const BY_NAME: Readonly<Record<string, number>> = {
  ...CORE_BY_NAME,
  ...Object.fromEntries(
    [...BACKEND_FAILURES].map(([name, f]) => [name, CODE_OF_KIND[f.kind]]),
  ),
};

/** The store could not be reached: `StoreUnavailableError` and the backends' own such classes. */
const UNAVAILABLE = new Set([
  "StoreUnavailableError",
  ...[...BACKEND_FAILURES].filter(([, f]) => f.kind === "unavailable").map(([name]) => name),
]);

/**
 * Failures to connect that say more than "--timeout passed" when both happen at once (the
 * connect timeout is capped by `--timeout`): every backend failure names its cause.
 */
const CONNECT_FAILURES = new Set([...UNAVAILABLE, ...BACKEND_FAILURES.keys()]);

/**
 * What to do about a setup mistake, in the CLI's flags (the library's message says what is wrong):
 * the hint of the store's own backend when the command chose one (two backends may raise one
 * class, e.g. `StoreAccessDeniedError`, with different flags to check), else any backend's.
 */
function hintOf(err: unknown, name: string, driver: BackendDriver | undefined): string {
  const failure = driver === undefined ? BACKEND_FAILURES.get(name) : driver.failures[name];
  return failure?.hint?.(err) ?? "";
}

function nameOf(err: unknown): string | undefined {
  return err instanceof Error ? err.name : undefined;
}

function messageOf(err: unknown): string {
  const text = errorMessage(err);
  // One line: the first line of a multi-line message (zod's pretty errors) with the rest folded.
  return text.split("\n").map((l) => l.trim()).filter((l) => l !== "").join("; ");
}

/**
 * Maps `err` to an exit code and a one-line message. `interrupted`/`timedOut` tell an abort by the
 * user from the `--timeout` deadline (both reject with the signal's reason).
 */
export function classify(
  err: unknown,
  context: {
    readonly interrupted: boolean;
    readonly timedOut?: string;
    /** The backend of the store the command chose, when it got that far. */
    readonly driver?: BackendDriver;
  },
): Failure {
  if (context.interrupted) return { code: ExitCode.Interrupted, message: "interrupted" };
  const name = nameOf(err);
  // A failure to connect that names its cause beats "the deadline passed" when both happen.
  if (context.timedOut !== undefined && !(name !== undefined && CONNECT_FAILURES.has(name))) {
    return {
      code: ExitCode.Unavailable,
      message: `the store did not answer within ${context.timedOut} (--timeout)`,
    };
  }
  if (name === "AllocationFailedError") {
    // The last attempt's error says why; a store that went away is not a refusal.
    const cause = (err as Error).cause;
    const code = UNAVAILABLE.has(nameOf(cause) ?? "") ? ExitCode.Unavailable : ExitCode.Refused;
    const why = cause === undefined ? "" : `: ${messageOf(cause)}`;
    return { code, message: `${messageOf(err)}${why}` };
  }
  if (name !== undefined && name in BY_NAME) {
    // The message says what failed in plain words, naming the store; the client's raw text is
    // the cause (`--debug` prints it).
    const prefix = name === "IdallocError"
      ? "the store refused: "
      : UNAVAILABLE.has(name)
      ? "store unavailable: "
      : "";
    const hint = hintOf(err, name, context.driver);
    return {
      code: BY_NAME[name],
      message: `${prefix}${messageOf(err)}${hint === "" ? "" : `; ${hint}`}`,
    };
  }
  if (err instanceof Deno.errors.BrokenPipe) {
    // The reader went away (`idalloc list | head`): nothing left to say to anyone.
    return { code: ExitCode.Ok, message: "" };
  }
  return {
    code: ExitCode.Internal,
    message: `internal error: ${messageOf(err)} (run with --debug for the stack trace)`,
  };
}
