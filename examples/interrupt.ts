/**
 * Ctrl-C and SIGTERM for the examples that start processes or make files: the first one aborts
 * the signal {@linkcode onInterrupt} returns, so that the example stops its child processes and
 * removes its temporary directory as a finished run does, then ends with exit code 130; a second
 * one ends the process at once. (Deno's default on SIGINT ends the process on the spot: no
 * `finally` runs, so a temporary directory stayed behind.)
 *
 * ```ts ignore
 * const interrupted = onInterrupt("demo");
 * try {
 *   await work(interrupted);
 * } finally {
 *   await Deno.remove(dir, { recursive: true });
 * }
 * exitIfInterrupted(interrupted);
 * ```
 *
 * @module
 */

/** The reason the signal of {@linkcode onInterrupt} aborts with. */
export class Interrupted extends Error {
  /** @param signal the signal received */
  constructor(signal: Deno.Signal) {
    super(`interrupted (${signal})`);
    this.name = "Interrupted";
  }
}

/**
 * A signal that aborts on the first SIGINT or SIGTERM; a second one exits with 130 at once
 * (after `name: interrupted again` on stderr).
 */
export function onInterrupt(name: string): AbortSignal {
  const controller = new AbortController();
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    Deno.addSignalListener(signal, () => {
      if (!controller.signal.aborted) {
        console.error(`${name}: ${signal}: stopping the node processes and cleaning up`);
        controller.abort(new Interrupted(signal));
        return;
      }
      console.error(`${name}: interrupted again: exiting without cleaning up`);
      Deno.exit(130);
    });
  }
  return controller.signal;
}

/** Exits with 130 if `signal` (of {@linkcode onInterrupt}) aborted. */
export function exitIfInterrupted(signal: AbortSignal): void {
  if (signal.aborted) Deno.exit(130);
}
