/**
 * The environment a user's shell gives a command: this process's, less the `INIT_CWD` that
 * `deno task test` set for the suite. `deno task` and the CLI resolve relative `kv:` paths
 * against an inherited `INIT_CWD`, so a child started with it would write into the repository.
 * Pass it with `clearEnv: true`.
 */
export function userEnv(extra: Record<string, string> = {}): Record<string, string> {
  const env = { ...Deno.env.toObject(), ...extra };
  delete env.INIT_CWD;
  return env;
}

/** What a finished command printed, decoded. */
export interface CommandOutput {
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Runs `command` to its end with `options` and decodes its output. */
export async function runCommand(
  command: string,
  options: Omit<Deno.CommandOptions, "stdout" | "stderr">,
): Promise<CommandOutput> {
  const out = await new Deno.Command(command, { ...options, stdout: "piped", stderr: "piped" })
    .output();
  const decoder = new TextDecoder();
  return { code: out.code, stdout: decoder.decode(out.stdout), stderr: decoder.decode(out.stderr) };
}
