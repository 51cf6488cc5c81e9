/**
 * Library-style logging through LogTape: categories under `["idalloc", …]`, silent until the
 * application calls LogTape's `configure()` (the library never does).
 *
 * @module
 */
import { getLogger, type Logger } from "./deps/logtape.ts";

/** A logger for `["idalloc", ...category]`. */
export function idallocLogger(...category: string[]): Logger {
  return getLogger(["idalloc", ...category]);
}
