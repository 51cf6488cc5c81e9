/**
 * `--store kv:<file>`: an embedded Deno KV file (or a KV Connect URL, or `:memory:`). `--prefix`
 * is `a/b` or a JSON array of strings and numbers; `--poll` and `--clock-skew` tune the backend.
 *
 * A file that does not exist yet is an empty store for commands that only read (they report an
 * empty result), and is created by commands that allocate. A file in a directory that does not
 * exist is a usage error: the path is wrong.
 *
 * @module
 */
import { DenoKvBackend } from "../../backends/kv/mod.ts";
import { InvalidOptionsError, StoreUnavailableError } from "../../errors.ts";
import { formatDuration, type GlobalOptions } from "../args.ts";
import type { DriverOpenOptions, OpenedBackend, StoreDriver } from "./driver.ts";

/** The Deno KV prefix when `--prefix` is not given. */
export const DEFAULT_KV_PREFIX: readonly string[] = ["idalloc"];

function errorText(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

/** The Deno KV prefix of `--prefix`: `a/b` → `["a", "b"]`, or a JSON array such as `["a", 1]`. */
export function kvPrefix(text: string | undefined): (string | number)[] {
  if (text === undefined) return [...DEFAULT_KV_PREFIX];
  if (text.trimStart().startsWith("[")) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(text);
    } catch (err) {
      throw new InvalidOptionsError(`invalid option: --prefix is not a JSON array: ${text}`, {
        cause: err,
      });
    }
    const valid = Array.isArray(parsed) && parsed.length > 0 &&
      parsed.every((p) =>
        (typeof p === "string" && p !== "") || (typeof p === "number" && Number.isFinite(p))
      );
    if (!valid) {
      throw new InvalidOptionsError(
        `invalid option: --prefix must be a non-empty JSON array of non-empty strings and ` +
          `numbers, got ${text}`,
      );
    }
    return parsed as (string | number)[];
  }
  const parts = text.split("/");
  if (parts.some((p) => p === "")) {
    throw new InvalidOptionsError(
      `invalid option: --prefix '${text}' has an empty part (write a/b, or a JSON array)`,
    );
  }
  return parts;
}

function isLocalFile(path: string): boolean {
  return path !== ":memory:" && !/^https?:\/\//.test(path);
}

/**
 * A relative path against the directory the user ran the command in: `deno task` runs tasks in
 * the directory of deno.json and says where it was started in `INIT_CWD` (npm scripts do the
 * same), so `deno task idalloc --store kv:ids.kv` names a file in the caller's directory, not the
 * repository's. Without `INIT_CWD` (or the env permission to read it) the path stays as given.
 */
export function callerPath(path: string): string {
  if (path.startsWith("/") || /^[A-Za-z]:[\\/]/.test(path)) return path;
  let base: string | undefined;
  let cwd: string | undefined;
  try {
    base = Deno.env.get("INIT_CWD");
    cwd = Deno.cwd();
  } catch {
    // No --allow-env (or --allow-read for the cwd): relative to the working directory, as given.
    return path;
  }
  if (base === undefined || base === "" || base === cwd) return path;
  return `${base.replace(/\/+$/, "")}/${path.replace(/^\.\//, "")}`;
}

/** Flags that only etcd understands: given with a Deno KV store, they are a mistake. */
const ETCD_ONLY: ReadonlyArray<[keyof GlobalOptions, string]> = [
  ["ca", "--ca"],
  ["cert", "--cert"],
  ["key", "--key"],
  ["tlsServerName", "--tls-server-name"],
  ["user", "--user"],
];

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
  {
    using file = await Deno.open(path, { read: true });
    read = await file.read(header);
  }
  if (read === null || read === 0) return; // an empty file: Deno KV sets it up
  if (new TextDecoder().decode(header.subarray(0, read)) !== SQLITE_HEADER) {
    throw new InvalidOptionsError(
      `invalid option: --store kv:${path}: the file is not a Deno KV store (not an SQLite ` +
        "database)",
    );
  }
  const { DatabaseSync } = await import("node:sqlite");
  let tables: string[];
  try {
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all()
        .map((row) => String((row as { name: unknown }).name));
    } finally {
      db.close();
    }
  } catch (err) {
    throw new StoreUnavailableError(`cannot read Deno KV store ${path}: ${errorText(err)}`, {
      cause: err,
    });
  }
  if (tables.length > 0 && !KV_TABLES.every((t) => tables.includes(t))) {
    const shown = tables.slice(0, 5).join(", ") + (tables.length > 5 ? ", …" : "");
    throw new InvalidOptionsError(
      `invalid option: --store kv:${path}: the file is an SQLite database but not a Deno KV ` +
        `store (it has tables ${shown}); refusing to add Deno KV's tables to it`,
    );
  }
}

/** The directory of a local path (`.` for a bare file name). */
function directoryOf(path: string): string {
  const slash = path.lastIndexOf("/");
  return slash < 0 ? "." : slash === 0 ? "/" : path.slice(0, slash);
}

async function exists(path: string): Promise<"file" | "directory" | "none"> {
  try {
    const info = await Deno.stat(path);
    return info.isDirectory ? "directory" : "file";
  } catch (err) {
    if (err instanceof Deno.errors.NotFound) return "none";
    throw new StoreUnavailableError(`cannot open Deno KV store ${path}: ${errorText(err)}`, {
      cause: err,
    });
  }
}

async function open(
  path: string,
  o: GlobalOptions,
  open: DriverOpenOptions,
): Promise<OpenedBackend> {
  if (typeof Deno.openKv !== "function") {
    // Deno KV is unstable in Deno 2: a `deno install -g` or `deno run` without the flag gets here.
    throw new InvalidOptionsError(
      `Deno KV needs Deno's --unstable-kv flag: run idalloc with \`deno run --unstable-kv …\` or ` +
        `install it with \`deno install -g -A --unstable-kv -n idalloc …\``,
    );
  }
  for (const [option, flag] of ETCD_ONLY) {
    if (o[option] !== undefined) {
      throw new InvalidOptionsError(
        `invalid option: ${flag} is for etcd; --store kv:${path} is a Deno KV store`,
      );
    }
  }
  if (isLocalFile(path)) path = callerPath(path);
  const prefix = kvPrefix(o.prefix);
  if (o.leaseTtlMs < 2 * o.clockSkewMs) {
    // Deno KV judges leases with the skew margin on both sides.
    throw new InvalidOptionsError(
      `invalid option: --lease-ttl (${formatDuration(o.leaseTtlMs)}) must be at least twice ` +
        `--clock-skew (${formatDuration(o.clockSkewMs)}) on Deno KV`,
    );
  }
  let missing = false;
  if (isLocalFile(path)) {
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
    missing = kind === "none" && !open.create;
    if (kind === "file") await checkKvFile(path);
  }
  let kv: Deno.Kv;
  try {
    // A file that is not there yet stays uncreated by commands that only read: they see an empty
    // in-memory store in its place.
    kv = await Deno.openKv(missing ? ":memory:" : path);
  } catch (err) {
    throw new StoreUnavailableError(`cannot open Deno KV store ${path}: ${errorText(err)}`, {
      cause: err,
    });
  }
  try {
    const backend = new DenoKvBackend(kv, {
      prefix,
      node: o.node,
      pollIntervalMs: o.pollMs,
      maxClockSkewMs: o.clockSkewMs,
      // The feed keeps at least two poll windows of history; keep the default unless polls are slow.
      logRetentionMs: Math.max(600_000, 2 * (o.pollMs + o.clockSkewMs)),
    });
    // A file that is not a KV store opens fine and fails on the first read: fail here instead.
    await backend.admin().namespaceExists(open.signal);
    return {
      backend,
      where: `deno-kv ${path}`,
      emptyBecause: missing ? `there is no Deno KV file at ${path} yet` : undefined,
      close: () => Promise.resolve(kv.close()),
    };
  } catch (err) {
    kv.close();
    if (err instanceof InvalidOptionsError) throw err;
    if (open.signal.aborted) throw err;
    throw new StoreUnavailableError(`cannot read Deno KV store ${path}: ${errorText(err)}`, {
      cause: err,
    });
  }
}

/** `kv:<file>`. */
export const kvDriver: StoreDriver = {
  scheme: "kv:",
  syntax: "kv:<file> (or kv:<KV Connect URL>)",
  valid: (rest) => rest !== "",
  open,
};
