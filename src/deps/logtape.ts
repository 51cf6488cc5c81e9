/**
 * LogTape, idalloc's log, named by its full `npm:` specifier so that the library resolves from a
 * directory with no import map (a user's project, `deno install -g`). The version range is the one
 * `deno.json`'s import map pins, so the lock resolves one copy for both; a test
 * (`tests/examples/outside.test.ts`) keeps them equal.
 *
 * @module
 */
export * from "npm:@logtape/logtape@^2.4.2";
