/**
 * The Deno KV driver: `--store kv:<file>` (or a KV Connect URL, or `:memory:`), see
 * `./store_description.ts` for how a store is named.
 *
 * A file that does not exist yet is an empty store for runs that only read (they report an empty
 * result), and is created by runs that allocate. A file in a directory that does not exist is a
 * usage error: the path is wrong. An existing file that is not a Deno KV store is refused, never
 * converted. Anything at the path that is not a regular file (a directory, a named pipe, a socket,
 * a device) is refused before it is opened: opening a FIFO blocks until a writer comes, and
 * SQLite would wait on it past any signal. A file that this process cannot read (another user's,
 * mode 600; an I/O error) is a {@linkcode StoreUnavailableError} that says the path and why in
 * words, not a raw system error.
 *
 * @module
 */
import { errorMessage, InvalidOptionsError, StoreUnavailableError } from "../../errors.ts";
import type { BackendDriver, DriverOpenOptions, OpenedBackend } from "../driver.ts";
import {
  describeKvStore,
  isLocalFile,
  KV_OPTIONS,
  type KvStoreDescription,
  kvStoreDescription,
} from "./store_description.ts";

/** The first 16 bytes of every SQLite database file. */
const SQLITE_HEADER = "SQLite format 3\0";

/** Tables every Deno KV file has (Deno's SQLite backend). */
const KV_TABLES = ["kv", "migration_state", "data_version"];

/**
 * Refuses an existing file that is not a Deno KV store: Deno.openKv would add its tables to any
 * SQLite database, and fail on anything else only at the first read.
 */
async function checkKvFile(path: string): Promise<void> {
  const header = new Uint8Array(16);
  let read: number | null;
  try {
    using file = await Deno.open(path, { read: true });
    read = await file.read(header);
  } catch (err) {
    throw new StoreUnavailableError(`cannot read Deno KV store ${path}: ${fileProblem(err)}`, {
      cause: err,
    });
  }
  if (read === null || read === 0) return; // an empty file: Deno KV sets it up
  if (new TextDecoder().decode(header.subarray(0, read)) !== SQLITE_HEADER) {
    throw new InvalidOptionsError(
      `invalid option: --store kv:${path}: the file is not a Deno KV store (not an SQLite ` +
        "database)",
    );
  }
  const tables = await tablesOf(path);
  if (tables.length > 0 && !KV_TABLES.every((t) => tables.includes(t))) {
    const shown = tables.slice(0, 5).join(", ") + (tables.length > 5 ? ", …" : "");
    throw new InvalidOptionsError(
      `invalid option: --store kv:${path}: the file is an SQLite database but not a Deno KV ` +
        `store (it has tables ${shown}); refusing to add Deno KV's tables to it`,
    );
  }
}

/** The tables of the SQLite database at `path`, read without writing to it. */
async function tablesOf(path: string): Promise<string[]> {
  const { DatabaseSync } = await import("node:sqlite");
  try {
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      return db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all()
        .map((row) => String((row as { name: unknown }).name));
    } finally {
      db.close();
    }
  } catch (err) {
    throw new StoreUnavailableError(`cannot read Deno KV store ${path}: ${errorMessage(err)}`, {
      cause: err,
    });
  }
}

/** The directory of a local path (`.` for a bare file name). */
function directoryOf(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
}

/**
 * Why a file cannot be read, in words: the system's message names the error number, not what to
 * do about it.
 */
function fileProblem(err: unknown): string {
  if (err instanceof Deno.errors.PermissionDenied) {
    return "permission denied: this user may not read it (it belongs to another user, or its " +
      "mode forbids reading; check its owner and mode)";
  }
  if (err instanceof Deno.errors.NotCapable) {
    return "Deno's permissions do not cover it (run with --allow-read and --allow-write for it)";
  }
  if ((err as { code?: unknown })?.code === "EIO") {
    return "input/output error: the system could not read it (a device error, or a file such as " +
      "/proc/<pid>/mem that cannot be read as a store)";
  }
  return errorMessage(err);
}

/** What is at `path`: a regular file, a directory, something else (named), or nothing. */
type PathKind = "file" | "directory" | "none" | { other: string };

async function exists(path: string): Promise<PathKind> {
  let info: Deno.FileInfo;
  try {
    info = await Deno.stat(path);
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return "none";
    throw new StoreUnavailableError(`cannot open Deno KV store ${path}: ${fileProblem(err)}`, {
      cause: err,
    });
  }
  if (info.isDirectory) return "directory";
  if (info.isFile) return "file";
  // `stat` follows symbolic links: what is left is a special file.
  const other = info.isFifo
    ? "a named pipe (FIFO)"
    : info.isSocket
    ? "a socket"
    : info.isCharDevice
    ? "a character device"
    : info.isBlockDevice
    ? "a block device"
    : "not a regular file";
  return { other };
}

/** Deno KV is unstable in Deno 2: a `deno install -g` or `deno run` without the flag lacks it. */
function requireUnstableKv(): void {
  if (typeof Deno.openKv === "function") return;
  throw new InvalidOptionsError(
    "Deno KV needs Deno's --unstable-kv flag: run idalloc with `deno run --unstable-kv …` or " +
      "install it with `deno install -g -A --unstable-kv -n idalloc …`",
  );
}

/**
 * Checks a local store's path and says whether its file is missing (and is to stay so: the run
 * may not create it). Throws `InvalidOptionsError` for a path that cannot be a store.
 */
async function checkPath(path: string, create: boolean): Promise<boolean> {
  if (!isLocalFile(path)) return false;
  const dir = directoryOf(path);
  if (await exists(dir) !== "directory") {
    throw new InvalidOptionsError(
      `invalid option: --store kv:${path}: directory ${dir} does not exist`,
    );
  }
  const kind = await exists(path);
  if (kind === "directory") {
    throw new InvalidOptionsError(`invalid option: --store kv:${path} is a directory`);
  }
  if (typeof kind === "object") {
    throw new InvalidOptionsError(
      `invalid option: --store kv:${path} is ${kind.other}, not a file: a Deno KV store is a ` +
        "regular file (or a path where one may be created)",
    );
  }
  if (kind === "file") await checkKvFile(path);
  return kind === "none" && !create;
}

async function openKv(path: string): Promise<Deno.Kv> {
  try {
    return await Deno.openKv(path);
  } catch (err) {
    throw new StoreUnavailableError(`cannot open Deno KV store ${path}: ${fileProblem(err)}`, {
      cause: err,
    });
  }
}

async function open(d: KvStoreDescription, options: DriverOpenOptions): Promise<OpenedBackend> {
  requireUnstableKv();
  const missing = await checkPath(d.path, options.create);
  // A file that is not there yet stays uncreated by runs that only read: they see an empty
  // in-memory store in its place.
  const kv = await openKv(missing ? ":memory:" : d.path);
  try {
    const { DenoKvBackend } = await import("./mod.ts");
    const backend = new DenoKvBackend(kv, {
      prefix: [...d.prefix],
      node: options.node,
      pollIntervalMs: d.pollIntervalMs,
      maxClockSkewMs: d.maxClockSkewMs,
      // The feed keeps at least two poll windows of history; keep the default unless polls are slow.
      logRetentionMs: Math.max(600_000, 2 * (d.pollIntervalMs + d.maxClockSkewMs)),
    });
    // A file that is not a KV store opens fine and fails on the first read: fail here instead.
    await backend.admin().namespaceExists(options.signal);
    return {
      backend,
      where: `deno-kv ${d.path}`,
      emptyBecause: missing ? `there is no Deno KV file at ${d.path} yet` : undefined,
      pollIntervalMs: d.pollIntervalMs,
      close: () => Promise.resolve(kv.close()),
    };
  } catch (err) {
    kv.close();
    if (err instanceof InvalidOptionsError) throw err;
    if (options.signal.aborted) throw err;
    throw new StoreUnavailableError(`cannot read Deno KV store ${d.path}: ${errorMessage(err)}`, {
      cause: err,
    });
  }
}

/** Damage only a Deno KV store can hold: its indexes, counters, lease records and change feed. */
export const KV_DAMAGE_KINDS: Readonly<Record<string, string>> = {
  "index-undecodable": "a key index whose value is not `{ id }` with a safe integer",
  "index-orphan": "a key index naming an ID whose master is absent or belongs to another key",
  "index-out-of-range":
    "a key index naming an ID (whose master is the key's) outside every valid range of the scan",
  "counter-wrong-type": "a counter (`gen`, `touch`) that does not hold a `Deno.KvU64`",
  "lease-undecodable": "a lease record of the wrong shape",
  "log-undecodable": "a change-feed entry of the wrong shape",
};

/** The Deno KV backend, as idalloc's tools know it. */
export const kvDriver: BackendDriver<KvStoreDescription> = {
  kind: "deno-kv",
  folder: new URL("./", import.meta.url).href,
  title: "Deno KV",
  scheme: "kv:",
  syntax: "kv:<file> (or kv:<KV Connect URL>)",
  exampleStore: "kv:./ids.kv",
  prefixSyntax: 'a/b or a JSON array (default "idalloc")',
  options: KV_OPTIONS,
  description: kvStoreDescription,
  damageKinds: KV_DAMAGE_KINDS,
  // Deno KV fails with the core classes only (a file that cannot be opened is unavailable).
  failures: {},
  accepts: (rest) => rest !== "",
  describe: describeKvStore,
  open,
};
