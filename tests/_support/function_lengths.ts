/**
 * Function lengths in TypeScript sources, measured on the syntax tree that `deno lint` parses
 * (through `Deno.lint.runPlugin`, so no TypeScript compiler is needed). A function's length is the
 * number of lines from its first line (the method name, the `function` keyword or an arrow's
 * parameters) to its closing brace, both included; a nested function counts inside its parent too.
 *
 * `Deno.lint.runPlugin` exists only under `deno test`, so this runs from tests
 * (`tests/structure/function_length.test.ts`).
 *
 * @module
 */

/** One function: where it starts, what it is called and how many lines it spans. */
export interface FunctionLength {
  readonly file: string;
  readonly line: number;
  readonly name: string;
  readonly lines: number;
}

interface Ranged {
  readonly range: [number, number];
}

type Named = Ranged & {
  readonly id?: { readonly name?: string } | null;
  readonly key?: { readonly name?: string; readonly value?: unknown };
  readonly parent?: Named;
};

/** The lengths of every function, method, accessor and arrow function in `source`. */
export function functionLengths(file: string, source: string): FunctionLength[] {
  const found: FunctionLength[] = [];
  const lineAt = (offset: number) => source.slice(0, offset).split("\n").length;
  const record = (node: Named, name: string) => {
    const [start, end] = node.range;
    const line = lineAt(start);
    found.push({ file, line, name, lines: lineAt(end) - line + 1 });
  };
  const keyName = (node: Named) => node.key?.name ?? String(node.key?.value ?? "?");
  const plugin: Deno.lint.Plugin = {
    name: "function-length",
    rules: {
      measure: {
        create() {
          return {
            FunctionDeclaration: (node) => record(node as Named, node.id?.name ?? "default"),
            // A method's own node starts at its name; its function expression at the parameters.
            MethodDefinition: (node) => record(node as Named, keyName(node as Named)),
            FunctionExpression: (node) => {
              const parent = (node as Named).parent as Named & { type?: string };
              if (parent?.type === "MethodDefinition") return;
              const name = parent?.type === "Property" ? keyName(parent) : node.id?.name;
              record(node as Named, name ?? "function");
            },
            ArrowFunctionExpression: (node) => {
              const parent = (node as Named).parent as Named & { type?: string };
              const name = parent?.type === "VariableDeclarator"
                ? parent.id?.name
                : parent?.type === "Property" || parent?.type === "PropertyDefinition"
                ? keyName(parent)
                : undefined;
              record(node as Named, name ?? "=>");
            },
          };
        },
      },
    },
  };
  Deno.lint.runPlugin(plugin, file, source);
  return found;
}

/** Every `.ts` file under `dir`, recursively, sorted. */
export async function sourceFiles(dir: string): Promise<string[]> {
  const files: string[] = [];
  const walk = async (path: string) => {
    for await (const entry of Deno.readDir(path)) {
      const child = `${path}/${entry.name}`;
      if (entry.isDirectory) await walk(child);
      else if (entry.isFile && child.endsWith(".ts")) files.push(child);
    }
  };
  await walk(dir);
  return files.sort();
}
