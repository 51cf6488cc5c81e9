/**
 * Plain-text tables for the terminal: columns padded to their widest cell, the last column left
 * unpadded (keys can be long), rows streamed into a {@linkcode Sink}.
 *
 * @module
 */
import type { Sink } from "./io.ts";

/** Writes `header` (unless `null`) and `rows` as an aligned table. */
export function writeTable(
  sink: Sink,
  header: readonly string[] | null,
  rows: Iterable<string[]>,
): void {
  const all = Array.isArray(rows) ? rows as string[][] : [...rows];
  const widths = (header ?? all[0] ?? []).map((h) => (header ? h.length : 0));
  for (const row of all) {
    for (let i = 0; i < row.length - 1; i++) {
      if (row[i].length > widths[i]) widths[i] = row[i].length;
    }
  }
  const format = (row: readonly string[]) =>
    row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]))).join("  ");
  if (header) sink.line(format(header));
  for (const row of all) sink.line(format(row));
}
