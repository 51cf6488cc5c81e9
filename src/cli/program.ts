/**
 * The command line, declared with commander: commands, options, help texts. Parsing only picks a
 * command and collects its options; {@linkcode parseCommandLine} returns what to run, and `main`
 * runs it, so that every failure goes through one error path.
 *
 * @module
 */
import { Command, CommanderError, Option } from "../deps/commander.ts";
import denoJson from "../../deno.json" with { type: "json" };
import {
  type CollectedOptions,
  durationOption,
  type GlobalOptions,
  globalOptions,
  integerOption,
} from "./args.ts";
import { completionScript, SHELLS } from "./completion.ts";
import { errorLine } from "./exit.ts";
import { defaultNodeName } from "./node_name.ts";
import { BACKENDS, storeSyntax } from "../backends/registry.ts";
import type { BackendDriver, StoreOption } from "../backends/driver.ts";
import { longFlag } from "../backends/driver_options.ts";
import type { RunContext } from "./context.ts";
import type { Output } from "./io.ts";
import { allocateCommand, releaseCommand } from "./commands/allocate.ts";
import { doctorCommand } from "./commands/doctor.ts";
import { gcCommand } from "./commands/gc.ts";
import {
  identityAllocateCommand,
  identityGetCommand,
  identityListCommand,
  identityReleaseCommand,
} from "./commands/identity.ts";
import { refsCommand } from "./commands/refs.ts";
import { listCommand } from "./commands/list.ts";
import { getCommand, getIdCommand } from "./commands/lookup.ts";
import { statusCommand } from "./commands/status.ts";
import { watchCommand } from "./commands/watch.ts";

/** A parsed command line: the validated global options and the command to run. */
export interface ParsedCommand {
  /** Validated global options. */
  readonly options: GlobalOptions;
  /** Runs the command; resolves to the exit code. */
  readonly run: (ctx: RunContext) => Promise<number>;
}

/** What parsing ended with: a command to run, or an exit code (help shown, usage error). */
export type ParseResult =
  | { readonly kind: "run"; readonly command: ParsedCommand }
  | { readonly kind: "exit"; readonly code: number };

const EXIT_CODES_HELP = `
Exit codes:
  0    ok (an empty list is a list: [] and exit 0)
  1    usage: bad option, key, ID or label; nothing stored under --prefix (for lookups and
       gc); etcd setup mistakes: credentials or permissions etcd denies, credentials for an
       etcd without authentication, TLS that does not fit the server, an endpoint that is not etcd
  2    store unavailable: host name not resolvable, connection refused, no answer within
       --connect-timeout, a KV file that cannot be opened, or no answer within --timeout
  3    not found: get / get-id / identity get / release found no such key, ID or reference
  4    refused: no free ID left, allocation failed after its retries, corrupt entry, a --node
       whose lease is live (a running node, or a run that exited within its lease TTL)
  5    internal error (a bug; --debug prints the stack trace)
  130  interrupted (Ctrl-C) before a one-shot command finished
`;

const EXAMPLES_HELP = `
Examples:
  idalloc allocate 'app=web;'                         ID of a key (created if new)
  idalloc get 'app=web;'                              just the ID, for scripts
  idalloc list --json                                 every ID and key, as JSON
  idalloc watch                                       changes as JSON lines until Ctrl-C
  idalloc gc --every 15m                              collect unused IDs, like Cilium's operator
  idalloc --store etcd://127.0.0.1:2379 status        etcd in Cilium's layout
  idalloc refs --by-node                              which nodes reference how many keys
  idalloc doctor --fix                                find and delete garbage under the prefix
  idalloc identity allocate k8s:app=web k8s:io.kubernetes.pod.namespace=prod
  source <(idalloc completion bash)                   shell completion (bash, zsh, fish)
`;

const STORE_GROUP = "Store options:";
const TUNING_GROUP = "Tuning options:";
const OUTPUT_GROUP = "Output options:";

function defaultNode(): string {
  let host = "localhost";
  try {
    host = Deno.hostname();
  } catch {
    // No --allow-sys: the PID alone keeps the name unique enough on one machine.
  }
  // The PID points an operator at the process; the random part keeps two runs inside one process
  // (main() called in-process) from sharing a node name, and so a lease.
  return defaultNodeName(host, Deno.pid, crypto.randomUUID().slice(0, 4));
}

/** Adds `option` to `program`'s help group `group`. */
function add(program: Command, option: Option, group: string): void {
  program.addOption(option.helpGroup(group));
}

function addStoreOptions(program: Command): void {
  add(
    program,
    new Option("--store <spec>", `the store: ${storeSyntax()}`)
      .default("kv:./idalloc.kv").env("IDALLOC_STORE"),
    STORE_GROUP,
  );
  const prefixes = BACKENDS.map((d) => `${d.title} ${d.prefixSyntax}`).join("; ");
  add(
    program,
    new Option("--prefix <prefix>", `namespace in the store: ${prefixes}`).env("IDALLOC_PREFIX"),
    STORE_GROUP,
  );
  add(
    program,
    new Option(
      "--identity-allocation-mode <mode>",
      "Cilium's mode: kvstore (an etcd store), crd (a k8s store), doublewrite-readkvstore or " +
        "doublewrite-readcrd (both: --store etcd://… and --kubeconfig)",
    ).env("IDALLOC_IDENTITY_ALLOCATION_MODE"),
    STORE_GROUP,
  );
  add(
    program,
    new Option("--kubeconfig <file>", "the CRD side's kubeconfig in a double-write mode"),
    STORE_GROUP,
  );
  add(
    program,
    new Option(
      "--node <name>",
      "node name of this run's references (default: cli-<host>-<pid>-<random>); never a running node's",
    ),
    STORE_GROUP,
  );
}

/** The help group of `driver`'s own options. */
function backendGroup(driver: BackendDriver): string {
  return `${driver.title} store options (--store ${driver.scheme}…):`;
}

/**
 * Every backend's own options, each backend in a help group of its own. An option two backends
 * share is declared once, in the group of the first, and its help names the others.
 */
function addBackendOptions(program: Command): void {
  const declared = new Set<string>();
  for (const driver of BACKENDS) {
    for (const spec of driver.options) {
      const flag = longFlag(spec);
      const also = BACKENDS.filter((d) =>
        d !== driver && d.options.some((x) => longFlag(x) === flag)
      );
      const option = storeOption(spec, also.map((d) => d.title));
      if (declared.has(option.attributeName())) continue;
      declared.add(option.attributeName());
      add(program, option, backendGroup(driver));
    }
  }
}

function storeOption(spec: StoreOption, also: readonly string[] = []): Option {
  const sharedWith = also.length > 0 ? ` (${also.join(", ")} too)` : "";
  const option = new Option(spec.flags, spec.description + sharedWith);
  if (spec.default !== undefined) option.default(spec.default);
  if (spec.env !== undefined) option.env(spec.env);
  return option;
}

function addTuningOptions(program: Command): void {
  add(
    program,
    new Option(
      "--timeout <duration>",
      "deadline to reach the store and of lookups (list, status and gc then run until done)",
    ).default("30s"),
    TUNING_GROUP,
  );
  add(
    program,
    new Option("--lease-ttl <duration>", "lease of this run's references").default("60s"),
    TUNING_GROUP,
  );
  add(
    program,
    new Option("--min <id>", "lowest ID to allocate / collect").default("256"),
    TUNING_GROUP,
  );
  add(
    program,
    new Option("--max <id>", "highest ID to allocate / collect").default("65535"),
    TUNING_GROUP,
  );
}

function addOutputOptions(program: Command): void {
  add(program, new Option("--json", "machine-readable output"), OUTPUT_GROUP);
  add(
    program,
    new Option("--progress", "show progress on stderr even when it is not a terminal"),
    OUTPUT_GROUP,
  );
  add(
    program,
    new Option("-v, --verbose", "print idalloc's log (info and up) on stderr"),
    OUTPUT_GROUP,
  );
  add(
    program,
    new Option("--debug", "print stack traces of unexpected errors and the causes of failures"),
    OUTPUT_GROUP,
  );
}

/** The global options: the store, each backend's own, tuning and output. */
function addGlobalOptions(program: Command): void {
  addStoreOptions(program);
  addBackendOptions(program);
  addTuningOptions(program);
  addOutputOptions(program);
}

/**
 * Under every command's own help: the global options by name only (`idalloc --help` explains
 * them), so that a command's help shows its own options first and stays short.
 */
function addGlobalOptionsHint(program: Command): void {
  const flags = program.options.map((o) => o.long ?? "")
    .filter((f) => f !== "" && f !== "--version");
  const lines: string[] = [];
  let line = "Global options (see idalloc --help):";
  for (const flag of flags) {
    if (line.length + flag.length + 2 > 98) {
      lines.push(line);
      line = " ";
    }
    line += ` ${flag}`;
  }
  lines.push(line);
  const hint = "\n" + lines.join("\n");
  const visit = (command: Command) => {
    for (const sub of command.commands) {
      sub.addHelpText("after", hint);
      visit(sub);
    }
  };
  visit(program);
}

/** Records the command that parsing selected. */
type Pick = (run: (ctx: RunContext) => Promise<number>) => void;

/** The program, with no options or commands yet: its output, help layout and usage errors. */
function newProgram(output: Output): Command {
  const backends = BACKENDS.map((d) => d.title).join(" or ");
  return new Command("idalloc")
    .description(`Cluster-wide small integer IDs for keys, on ${backends} (Cilium's ID allocator).`)
    .version(denoJson.version, "-V, --version")
    .exitOverride()
    .configureOutput({
      writeOut: (text) => output.out.write(text),
      writeErr: (text) => output.err.write(text),
      // Usage errors are reported by parseCommandLine, in one line with the fix (usageError).
      outputError: () => {},
      getOutHelpWidth: () => 100,
      getErrHelpWidth: () => 100,
      getOutHasColors: () => false,
      getErrHasColors: () => false,
    })
    .configureHelp({ showGlobalOptions: false, sortSubcommands: false })
    .addHelpText("after", EXAMPLES_HELP + EXIT_CODES_HELP);
}

/** `allocate`, `release`, `get`, `get-id`, `list`, `watch`: the commands on keys and IDs. */
function addKeyCommands(program: Command, pick: Pick): void {
  program.command("allocate")
    .description("print the ID of <key>, creating it if no node has one")
    .argument("<key>", "the key (any non-empty string)")
    .option("--hold", "keep referencing the key until Ctrl-C, then release it")
    .addHelpText(
      "after",
      "\nThe reference is this run's (--node): without --hold it stays after exit until the\n" +
        "run's lease lapses (the note says when; until then --node is refused to other runs),\n" +
        "and the ID lives on only while another node references the key. --hold follows the\n" +
        "key if its ID is given to another key (it says so) and releases what it holds.\n" +
        "A --node whose lease is live (running, or a run that exited lately) is refused (exit 4).",
    )
    .action((key: string, o: { hold?: boolean }) =>
      pick((ctx) => allocateCommand(ctx, key, { hold: o.hold ?? false }))
    );

  program.command("release")
    .description("delete node --node's reference to <key> (the ID stays until GC)")
    .argument("<key>", "the key")
    .addHelpText(
      "after",
      "\nA new process holds nothing, so release names the node explicitly: --node <name>.\n" +
        "The reference is deleted directly, without taking that node's lease, and only if the\n" +
        "node is not live (exit 4 otherwise, saying until when its lease runs: the node may\n" +
        "still use the ID). A node is live while its lease is: a CLI run's lapses --lease-ttl\n" +
        "after its last renewal; on etcd a dead node's references go with its lease.",
    )
    .action((key: string) => pick((ctx) => releaseCommand(ctx, key)));

  program.command("get")
    .description("print the ID of <key> (exit 3 if it has none)")
    .argument("<key>", "the key")
    .action((key: string) => pick((ctx) => getCommand(ctx, key)));

  program.command("get-id")
    .description("print the key of <id> (exit 3 if it is not allocated)")
    .argument("<id>", "the ID")
    .action((id: string) => pick((ctx) => getIdCommand(ctx, id)));

  program.command("list")
    .description("list every ID and its key, sorted by ID (a table, or --json)")
    .action(() => pick((ctx) => listCommand(ctx)));

  program.command("watch")
    .description("print ID changes as JSON lines until Ctrl-C")
    .option("--no-replay", "skip the current mappings; print only changes")
    .addHelpText(
      "after",
      '\nLines: {"type":"upsert","id":…,"key":…}, {"type":"delete",…}, and {"type":"synced"}\n' +
        "once the current mappings have been printed.\n\n" +
        "Nothing there yet is fine: on an empty prefix, or a Deno KV file that does not exist\n" +
        "yet, watch notes it on stderr and waits for the first allocation (it never creates\n" +
        "the file), so `watch` in one terminal and `allocate` in another just works.",
    )
    .action((o: { replay: boolean }) => pick((ctx) => watchCommand(ctx, { replay: o.replay })));
}

/** `gc`, `status`, `doctor`, `refs`: the operator's commands. */
function addOperatorCommands(program: Command, pick: Pick): void {
  program.command("gc")
    .description("delete IDs no node uses (two-round marking) and print what was deleted")
    .option("--every <duration>", "keep running: one pass per interval, e.g. 15m (>= --lease-ttl)")
    .option(
      "--grace <duration>",
      "time between the two passes of a single run (default: --lease-ttl, the least allowed)",
    )
    .option("--force", "allow --grace or --every shorter than --lease-ttl (see below)")
    .addHelpText(
      "after",
      "\nA pass marks unused IDs; the next pass deletes the ones still unused and unchanged.\n" +
        "Only IDs in [--min, --max] are considered.\n\n" +
        "Passes are at least --lease-ttl apart (give it the longest lease TTL of your nodes): a\n" +
        "node whose lease vanished without its knowing (revoked, or its record replaced) keeps\n" +
        "using its IDs until its own lease deadline, and must notice before they go to other\n" +
        "keys. --force allows less, for when no node can be in that state (all stopped, tests).",
    )
    .action((o: { every?: string; grace?: string; force?: boolean }) => {
      const everyMs = o.every === undefined ? undefined : durationOption("every", o.every, 10);
      const graceMs = o.grace === undefined ? undefined : durationOption("grace", o.grace);
      pick((ctx) => gcCommand(ctx, { everyMs, graceMs, force: o.force ?? false }));
    });

  program.command("status")
    .description("store health, node leases, ID and reference counts, split keys")
    .option("--usage", "accepted for older scripts: usage is always shown now")
    .addHelpText(
      "after",
      "\nSplit keys are keys whose live references name different IDs: only another writer\n" +
        "(e.g. a Cilium agent racing one that ignored its lock) makes them. They are listed\n" +
        "with the nodes behind each ID; stop the nodes whose references are wrong (their\n" +
        "references go with their leases; release --node never deletes a live node's).",
    )
    .action((o: { usage?: boolean }) =>
      pick((ctx) => statusCommand(ctx, { usage: o.usage ?? false }))
    );

  program.command("doctor")
    .description("list what in the store idalloc cannot use (garbage); --fix deletes it")
    .option("--fix", "delete each finding no live node holds, only if unchanged since listed")
    .addHelpText(
      "after",
      "\nFinds masters with a bad ID or an unreadable or oversized value, references that name no\n" +
        "ID, one outside every valid range or (etcd) on no lease, and (Deno KV) counters, indexes,\n" +
        "lease records and change-feed entries of the wrong shape. Valid ranges: [--min, --max],\n" +
        "and for identities (label-set keys) every cluster's range, as one prefix holds every\n" +
        "cluster's identities. --fix never deletes what a live node holds (an entry on a live\n" +
        "etcd lease, a Deno KV reference of a live node, a master, index or counter of an ID or\n" +
        "key live references name): it shows the holders (HELD BY) and what to do instead.\n" +
        "In a double-write mode (--identity-allocation-mode doublewrite-…) it also lists the\n" +
        "drift between the sides: an identity on one side only (--fix copies it across under the\n" +
        "other store's guards), an ID whose label sets differ or a label set whose IDs differ\n" +
        "(--fix replaces the entry on the side not read, only when nothing uses it there).\n" +
        "Exit 0 when no damage remains, 4 when some does (held entries too).",
    )
    .action((o: { fix?: boolean }) => pick((ctx) => doctorCommand(ctx, { fix: o.fix ?? false })));

  program.command("refs")
    .description("which nodes reference which key, live or dead, with totals")
    .argument("[key]", "only the references of this key")
    .option("--by-node", "one row per node: its references, live and dead")
    .action((key: string | undefined, o: { byNode?: boolean }) =>
      pick((ctx) => refsCommand(ctx, { key, byNode: o.byNode ?? false }))
    );
}

/** `identity allocate|release|get|list`: Cilium-style security identities. */
function addIdentityCommands(program: Command, pick: Pick): void {
  const identity = program.command("identity")
    .description("Cilium-style security identities for label sets");
  identity.command("allocate")
    .description("print the identity of a label set, creating it if needed")
    .argument("<labels...>", "labels such as k8s:app=web reserved:host cidr:10.0.0.0/8")
    .option("--cluster-id <id>", "this cluster's ID (0–255): the range of its identities", "0")
    .option("--cluster-name <name>", "this cluster's name", "default")
    .option("--hold", "keep referencing the identity until Ctrl-C, then release it")
    .action(
      (labels: string[], o: { clusterId: string; clusterName: string; hold?: boolean }) => {
        const clusterId = integerOption("cluster-id", o.clusterId);
        pick((ctx) =>
          identityAllocateCommand(ctx, labels, {
            clusterId,
            clusterName: o.clusterName,
            hold: o.hold ?? false,
          })
        );
      },
    );
  identity.command("release")
    .description("delete node --node's reference to the identity of a label set")
    .argument("<labels...>", "the label set, as for identity allocate")
    .addHelpText(
      "after",
      "\nrelease for label sets: the reference of node --node (required) is deleted only if\n" +
        "that node is not live (exit 4 otherwise); the identity stays until GC.",
    )
    .action((labels: string[]) => pick((ctx) => identityReleaseCommand(ctx, labels)));
  identity.command("get")
    .description("print the labels of identity <id> (exit 3 if it does not exist)")
    .argument("<id>", "the numeric identity")
    .option("--cluster-name <name>", "this cluster's name (in well-known identities)", "default")
    .action((id: string, o: { clusterName: string }) =>
      pick((ctx) => identityGetCommand(ctx, id, { clusterName: o.clusterName }))
    );
  identity.command("list")
    .description("list the identities in the store (a table, or --json)")
    .option("--reserved", "also list the reserved and well-known identities")
    .option("--cluster-name <name>", "this cluster's name (in well-known identities)", "default")
    .action((o: { clusterName: string; reserved?: boolean }) =>
      pick((ctx) =>
        identityListCommand(ctx, { clusterName: o.clusterName, reserved: o.reserved ?? false })
      )
    );
}

/** `completion <shell>`: the completion script of the whole program. */
function addCompletionCommand(program: Command, pick: Pick): void {
  program.command("completion")
    .description(`print a shell completion script (${SHELLS.join(", ")})`)
    .argument("<shell>", SHELLS.join(" | "))
    .addHelpText(
      "after",
      "\nbash:  source <(idalloc completion bash)        (or save it in bash-completion's dir)\n" +
        "zsh:   source <(idalloc completion zsh)         (compinit must have run)\n" +
        "fish:  idalloc completion fish > ~/.config/fish/completions/idalloc.fish",
    )
    .action((shell: string) => {
      const script = completionScript(program, shell);
      pick((ctx) => {
        ctx.output.out.write(script);
        return Promise.resolve(0);
      });
    });
}

/**
 * Makes every command record itself as the one that failed when commander reports a usage error
 * (commander's error text does not say which command it was about).
 */
function recordFailingCommand(program: Command): { command?: Command } {
  const failed: { command?: Command } = {};
  const visit = (command: Command) => {
    command.configureOutput({ outputError: () => void (failed.command = command) });
    command.commands.forEach(visit);
  };
  visit(program);
  return failed;
}

/** `idalloc identity allocate`: the command line that leads to `command`. */
function commandPath(command: Command): string {
  const names: string[] = [];
  for (let c: Command | null = command; c !== null; c = c.parent) names.unshift(c.name());
  return names.join(" ");
}

/**
 * Commander's usage error (`error: unknown option '--jsn'` and maybe `(Did you mean --json?)` on
 * a second line) as one line that names the fix: the suggestion, else where the right usage is.
 */
export function usageError(message: string, command: Command): string {
  const [first, ...rest] = message.trim().split("\n");
  const what = first.replace(/^error: /, "").replace(/\.$/, "");
  const suggestion = /\(Did you mean (.+)\?\)/.exec(rest.join(" "))?.[1];
  if (suggestion !== undefined) return `${what}; did you mean ${suggestion}?`;
  const missing = /^option '(.+)' argument missing$/.exec(what);
  if (missing !== null) return `option '${missing[1]}' needs a value: ${missing[1]}`;
  const path = commandPath(command);
  if (/^unknown (option|command)/.test(what)) {
    return `${what}; '${path} --help' lists the ${
      what.includes("option") ? "options" : "commands"
    }`;
  }
  return `${what}; usage: ${path} ${command.usage()}`;
}

/** The global options commander collected, with where each came from. */
function collectedOptions(program: Command): CollectedOptions {
  const values = program.opts();
  return {
    values,
    sourceOf: (attribute) => program.getOptionValueSource(attribute),
    envOf: (attribute) => program.options.find((o) => o.attributeName() === attribute)?.envVar,
  };
}

/**
 * Parses `args` (without the program name). Help and usage errors are written by commander to
 * `output` and end in `{ kind: "exit" }`.
 */
export async function parseCommandLine(
  args: string[],
  output: Output,
  json = false,
): Promise<ParseResult> {
  let selected: ((ctx: RunContext) => Promise<number>) | undefined;
  const pick: Pick = (run) => {
    selected = run;
  };
  const program = newProgram(output);
  addGlobalOptions(program);
  addKeyCommands(program, pick);
  addOperatorCommands(program, pick);
  addIdentityCommands(program, pick);
  addCompletionCommand(program, pick);
  addGlobalOptionsHint(program);
  const failed = recordFailingCommand(program);
  try {
    await program.parseAsync(args, { from: "user" });
  } catch (err) {
    if (!(err instanceof CommanderError)) throw err;
    if (err.exitCode === 0) return { kind: "exit", code: 0 };
    // Help shown for a command group (`idalloc identity`) is its own message.
    if (err.code !== "commander.help" && err.code !== "commander.helpDisplayed") {
      output.err.line(
        errorLine(json, 1, "UsageError", usageError(err.message, failed.command ?? program)),
      );
    }
    return { kind: "exit", code: 1 };
  }
  if (selected === undefined) {
    // `idalloc identity` alone: commander printed the group's help.
    return { kind: "exit", code: 1 };
  }
  const nodeGiven = program.getOptionValueSource("node") !== undefined;
  const collected = collectedOptions(program);
  const options = globalOptions({
    ...collected,
    values: { ...collected.values, node: collected.values.node ?? defaultNode() },
  }, nodeGiven);
  return { kind: "run", command: { options, run: selected } };
}
