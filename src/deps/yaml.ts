/**
 * yaml, the YAML parser that reads kubeconfig files (only the Kubernetes backend loads it), named
 * by its full `npm:` specifier so that the library resolves from a directory with no import map (a
 * user's project, `deno install -g`). The version is the one `deno.json`'s import map pins, so
 * the lock resolves one copy for both; a test (`tests/examples/outside.test.ts`) keeps them equal.
 *
 * @module
 */
export * from "npm:yaml@2.9.1";
