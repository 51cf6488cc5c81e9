/**
 * Where the test servers keep their data: a memory-backed directory (`/dev/shm`, Linux's tmpfs)
 * where the system has a writable one, else the temporary directory. An etcd syncs every write to
 * disk; on a shared disk a busy machine turned those syncs into `etcdserver: request timed out`
 * for every test using the server, while in memory a sync costs nothing. A test server's data
 * lives only as long as its run, so losing it with the machine loses nothing.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { statSync } from "node:fs";
 * import { serverDataRoot } from "./server_data.ts";
 *
 * assert.ok(statSync(serverDataRoot()).isDirectory());
 * ```
 *
 * @module
 */
import { accessSync, constants, statSync } from "node:fs";
import { tmpdir } from "node:os";

/** The memory-backed directory tried first. */
const MEMORY_DIR = "/dev/shm";

let root: string | undefined;

/** The directory test servers create their data directories in (decided once per process). */
export function serverDataRoot(): string {
  root ??= writableDir(MEMORY_DIR) ? MEMORY_DIR : tmpdir();
  return root;
}

function writableDir(path: string): boolean {
  try {
    if (!statSync(path).isDirectory()) return false;
    accessSync(path, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}
