/**
 * No function in `src/` is longer than {@linkcode MAX_LINES} lines (issue 30: a protocol step that
 * long mixes reading, judging and writing; split it into phases — read → classify → plan → apply,
 * or model → render — each testable on plain data). Measured on the syntax tree `deno lint`
 * parses (`tests/_support/function_lengths.ts`); the development harnesses under
 * `src/backends/<name>/testing/` count too.
 */
import assert from "node:assert/strict";
import { functionLengths, sourceFiles } from "../_support/function_lengths.ts";

const MAX_LINES = 80;
const ROOT = new URL("../../", import.meta.url).pathname;

Deno.test(`no function in src/ is longer than ${MAX_LINES} lines`, async () => {
  const files = await sourceFiles(`${ROOT}src`);
  assert.ok(files.length > 50, "the scan found src/");
  const long = [];
  for (const file of files) {
    for (const f of functionLengths(file, await Deno.readTextFile(file))) {
      if (f.lines > MAX_LINES) {
        long.push(`${f.file.slice(ROOT.length)}:${f.line} ${f.name}: ${f.lines}`);
      }
    }
  }
  assert.deepEqual(long, [], "split these into phases");
});

Deno.test("the measure counts from a function's first line to its closing brace", () => {
  const source = [
    "export function a(x: number): number {", // 1
    "  const inner = (y: number) => {", //         2
    "    return y;", //                             3
    "  };", //                                      4
    "  return inner(x);", //                        5
    "}", //                                         6
    "class C {", //                                 7
    "  m(): void {}", //                            8
    "  get g(): number {", //                       9
    "    return 1;", //                            10
    "  }", //                                      11
    "}", //                                        12
    "const o = { f() { return `}`; }, h: function () {\n  // }\n} };", // 13–15
    "async function* gen() {\n  yield 1;\n}", // 16–18
  ].join("\n");
  assert.deepEqual(
    functionLengths("x.ts", source).map(({ name, line, lines }) => [name, line, lines]),
    [
      ["a", 1, 6],
      ["inner", 2, 3],
      ["m", 8, 1],
      ["g", 9, 3],
      ["f", 13, 1],
      ["h", 13, 3],
      ["gen", 16, 3],
    ],
  );
});
