/**
 * Shell completion for bash, zsh and fish, generated from the declared commands and options, so
 * it never drifts from the parser: commands and subcommands, each command's options plus the
 * global ones (each backend's own among them, from its driver), file names after the options
 * whose value is a file (`--ca`, `--cert`, `--key` of etcd), and shells after `completion`.
 *
 * @module
 */
import type { Command, Option } from "../deps/commander.ts";
import { InvalidOptionsError } from "../errors.ts";
import { longFlag } from "../backends/driver_options.ts";
import { BACKENDS } from "../backends/registry.ts";

/** The shells {@linkcode completionScript} writes for. */
export const SHELLS: readonly string[] = ["bash", "zsh", "fish"];

/** Options whose value is a file name, as the backends' drivers declare them. */
const FILE_OPTIONS = new Set(
  BACKENDS.flatMap((d) => d.options.filter((o) => o.file).map(longFlag)),
);

/** The backend whose own option `flag` is, by title (`etcd` for `--ca`), for descriptions. */
const BACKEND_OF_FLAG = new Map(
  BACKENDS.flatMap((d) => d.options.map((o) => [longFlag(o), d.title] as const)).reverse(),
);

interface Node {
  /** Words from the program to this command: `""`, `"identity"`, `"identity get"`. */
  readonly path: string;
  readonly command: Command;
}

function walk(program: Command): Node[] {
  const out: Node[] = [];
  const visit = (command: Command, path: string) => {
    out.push({ path, command });
    for (const sub of command.commands) {
      visit(sub, path === "" ? sub.name() : `${path} ${sub.name()}`);
    }
  };
  visit(program, "");
  return out;
}

function flagsOf(options: readonly Option[]): string[] {
  return options.flatMap((o) => [o.long, o.short].filter((f): f is string => !!f));
}

function takesValue(option: Option): boolean {
  return option.required || option.optional;
}

/** Single-quoted for a shell. */
function sq(text: string): string {
  return `'${text.replaceAll("'", `'\\''`)}'`;
}

function bash(program: Command): string {
  const nodes = walk(program);
  const global = flagsOf(program.options).concat("--help");
  const valueFlags = [...program.options, ...nodes.flatMap((n) => n.command.options)]
    .filter(takesValue)
    .flatMap((o) => flagsOf([o]));
  const subcommands = nodes
    .map((n) =>
      `    ${sq(n.path)}) echo ${sq(n.command.commands.map((c) => c.name()).join(" "))} ;;`
    )
    .join("\n");
  const options = nodes
    .map((n) =>
      `    ${sq(n.path)}) echo ${
        sq(
          [...flagsOf(n.command.options), ...(n.path === "" ? ["--version"] : global)]
            .filter((f, i, all) => all.indexOf(f) === i).join(" "),
        )
      } ;;`
    )
    .join("\n");
  return `# bash completion for idalloc (written by: idalloc completion bash)
_idalloc_subcommands() {
  case "$1" in
${subcommands}
  esac
}
_idalloc_options() {
  case "$1" in
${options}
  esac
}
_idalloc_takes_value() {
  case "$1" in
    ${[...new Set(valueFlags)].join("|")}) return 0 ;;
  esac
  return 1
}
_idalloc() {
  local cur="\${COMP_WORDS[COMP_CWORD]}" prev="" path="" word i skip=0
  for ((i = 1; i < COMP_CWORD; i++)); do
    word="\${COMP_WORDS[i]}"
    if ((skip)); then skip=0; continue; fi
    if [[ $word == -* ]]; then
      _idalloc_takes_value "$word" && skip=1
      continue
    fi
    if [[ " $(_idalloc_subcommands "$path") " == *" $word "* ]]; then
      path="\${path:+$path }$word"
    fi
  done
  ((COMP_CWORD > 1)) && prev="\${COMP_WORDS[COMP_CWORD-1]}"
  if [[ -n $prev ]] && _idalloc_takes_value "$prev"; then
    case "$prev" in
      ${[...FILE_OPTIONS].join("|")}) COMPREPLY=($(compgen -f -- "$cur")) ;;
      *) COMPREPLY=() ;;
    esac
    return
  fi
  if [[ $path == completion ]]; then
    COMPREPLY=($(compgen -W ${sq(SHELLS.join(" "))} -- "$cur"))
  elif [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$(_idalloc_options "$path")" -- "$cur"))
  else
    COMPREPLY=($(compgen -W "$(_idalloc_subcommands "$path")" -- "$cur"))
  fi
}
complete -F _idalloc idalloc
`;
}

function zsh(program: Command): string {
  // zsh runs the bash function through its own bashcompinit layer: one generator, one behaviour.
  return `#compdef idalloc
# zsh completion for idalloc (written by: idalloc completion zsh)
autoload -U +X bashcompinit && bashcompinit
${bash(program).split("\n").slice(1).join("\n")}`;
}

function fish(program: Command): string {
  const lines = ["# fish completion for idalloc (written by: idalloc completion fish)"];
  lines.push("complete -c idalloc -f");
  const describe = (text: string) => sq(text.split("\n")[0].slice(0, 80));
  const optionLine = (option: Option, condition?: string) => {
    const parts = ["complete -c idalloc"];
    if (condition) parts.push(`-n ${sq(condition)}`);
    if (option.long) parts.push(`-l ${option.long.replace(/^--/, "")}`);
    if (option.short) parts.push(`-s ${option.short.replace(/^-/, "")}`);
    if (takesValue(option)) parts.push(option.long && FILE_OPTIONS.has(option.long) ? "-rF" : "-r");
    const backend = option.long === undefined ? undefined : BACKEND_OF_FLAG.get(option.long);
    parts.push(
      `-d ${describe(backend ? `${backend}: ${option.description}` : option.description)}`,
    );
    return parts.join(" ");
  };
  for (const option of program.options) lines.push(optionLine(option));
  for (const { path, command } of walk(program)) {
    const words = path === "" ? [] : path.split(" ");
    const condition = words.length === 0
      ? "__fish_use_subcommand"
      : `__fish_seen_subcommand_from ${words.at(-1)}`;
    for (const sub of command.commands) {
      lines.push(
        `complete -c idalloc -n ${sq(condition)} -a ${sub.name()} -d ${
          describe(sub.description())
        }`,
      );
    }
    if (words.length > 0) {
      for (const option of command.options) lines.push(optionLine(option, condition));
    }
    if (path === "completion") {
      lines.push(`complete -c idalloc -n ${sq(condition)} -a ${sq(SHELLS.join(" "))}`);
    }
  }
  return lines.join("\n") + "\n";
}

/**
 * The completion script of `program` for `shell`; throws {@linkcode InvalidOptionsError} for a
 * shell it does not know.
 */
export function completionScript(program: Command, shell: string): string {
  switch (shell) {
    case "bash":
      return bash(program);
    case "zsh":
      return zsh(program);
    case "fish":
      return fish(program);
    default:
      throw new InvalidOptionsError(
        `no completion for shell '${shell}': choose ${SHELLS.join(", ")}`,
      );
  }
}
