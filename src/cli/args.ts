/**
 * Validation of the CLI's options (zod, kept internal): durations, `--store`, `--prefix`, IDs and
 * the numeric knobs. Every failure is an {@linkcode InvalidOptionsError} naming the flag.
 *
 * @module
 */
import { z } from "zod";
import { InvalidIdError, InvalidOptionsError } from "../errors.ts";

const UNITS: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000 };

/** Milliseconds of `500ms`, `5s`, `1.5m`, `15m`, `1h`; `undefined` if it is not a duration. */
export function parseDuration(text: string): number | undefined {
  const match = /^(\d+(?:\.\d+)?)(ms|s|m|h)$/.exec(text.trim());
  if (!match) return undefined;
  const ms = Math.round(Number(match[1]) * UNITS[match[2]]);
  return Number.isSafeInteger(ms) ? ms : undefined;
}

/** `1500` → `1.5s`, `900000` → `15m`: durations as the user would type them. */
export function formatDuration(ms: number): string {
  if (ms % 3_600_000 === 0 && ms > 0) return `${ms / 3_600_000}h`;
  if (ms % 60_000 === 0 && ms > 0) return `${ms / 60_000}m`;
  if (ms >= 1000) return `${ms / 1000}s`;
  return `${ms}ms`;
}

const duration = (min: number) =>
  z.string()
    .refine((s) => parseDuration(s) !== undefined, "must be a duration such as 500ms, 5s, 15m, 1h")
    .transform((s) => parseDuration(s)!)
    .refine((ms) => ms >= min, `must be at least ${formatDuration(min)}`);

const integer = (min: number) =>
  z.string()
    .refine((s) => /^\d+$/.test(s.trim()), "must be a whole number")
    .transform((s) => Number(s))
    .refine((n) => Number.isSafeInteger(n) && n >= min, `must be a safe integer >= ${min}`);

/** Where the data lives: a Deno KV file (or KV Connect URL), or etcd endpoints. */
export type StoreSpec =
  | { readonly kind: "deno-kv"; readonly path: string }
  | { readonly kind: "etcd"; readonly hosts: readonly string[] };

function parseStore(text: string): StoreSpec | undefined {
  if (text.startsWith("kv:")) {
    const path = text.slice(3);
    return path === "" ? undefined : { kind: "deno-kv", path };
  }
  if (text.startsWith("etcd://")) {
    const hosts = text.slice("etcd://".length).split(",").map((h) => h.trim());
    const valid = hosts.every((h) => {
      if (h === "") return false;
      try {
        const url = new URL(`http://${h}`);
        return url.host !== "" && url.port !== "" && (url.pathname === "/" || url.pathname === "");
      } catch {
        return false;
      }
    });
    return valid ? { kind: "etcd", hosts } : undefined;
  }
  return undefined;
}

/** Options every command understands, after validation. */
export interface GlobalOptions {
  readonly store: StoreSpec;
  /** The `--store` text, for messages. */
  readonly storeText: string;
  /** The raw `--prefix`, or `undefined` for the backend's default. */
  readonly prefix?: string;
  readonly node: string;
  /** Whether `--node` was given (not the per-process default). */
  readonly nodeGiven: boolean;
  readonly ca?: string;
  readonly cert?: string;
  readonly key?: string;
  readonly tlsServerName?: string;
  readonly user?: string;
  readonly password?: string;
  readonly timeoutMs: number;
  readonly connectTimeoutMs: number;
  readonly leaseTtlMs: number;
  readonly pollMs: number;
  readonly clockSkewMs: number;
  readonly min: number;
  readonly max: number;
  readonly json: boolean;
  readonly progress: boolean;
  readonly debug: boolean;
  readonly verbose: boolean;
}

const globalSchema = z.object({
  store: z.string().refine(
    (s) => parseStore(s) !== undefined,
    "must be kv:<file> (or kv:<KV Connect URL>) or etcd://host:port[,host:port…]",
  ),
  prefix: z.string().min(1, "must not be empty").optional(),
  node: z.string().min(1).max(253).refine((s) => !s.includes("/"), "must not contain '/'"),
  ca: z.string().min(1).optional(),
  cert: z.string().min(1).optional(),
  key: z.string().min(1).optional(),
  tlsServerName: z.string().min(1).optional(),
  user: z.string().min(1).optional(),
  password: z.string().optional(),
  timeout: duration(1),
  connectTimeout: duration(1),
  leaseTtl: duration(500),
  poll: duration(10),
  clockSkew: duration(0),
  min: integer(1),
  max: integer(1),
  json: z.boolean().default(false),
  progress: z.boolean().default(false),
  debug: z.boolean().default(false),
  verbose: z.boolean().default(false),
}).refine((o) => o.max > o.min, { message: "must be greater than --min", path: ["max"] })
  .refine((o) => (o.cert === undefined) === (o.key === undefined), {
    message: "--cert and --key go together",
    path: ["cert"],
  })
  .refine((o) => !o.store.startsWith("kv:") || o.leaseTtl >= 2 * o.clockSkew, {
    // Deno KV judges leases with the skew margin on both sides.
    message: "must be at least twice --clock-skew on Deno KV",
    path: ["leaseTtl"],
  })
  .refine((o) => (o.user === undefined) === (o.password === undefined), {
    message: "--user needs --password (or IDALLOC_ETCD_PASSWORD)",
    path: ["user"],
  });

/** `leaseTtl` → `--lease-ttl`. */
export function flagName(path: readonly PropertyKey[]): string {
  const name = String(path[0] ?? "options");
  return `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
}

/** Parses `input` with `schema`; throws {@linkcode InvalidOptionsError} naming the flags. */
export function validate<T>(schema: z.ZodType<T>, input: unknown): T {
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const detail = parsed.error.issues
    .map((issue) => `${flagName(issue.path)} ${issue.message}`)
    .join("; ");
  throw new InvalidOptionsError(`invalid option: ${detail}`, { cause: parsed.error });
}

/** Validates the global options commander collected (strings and booleans). */
export function globalOptions(raw: Record<string, unknown>, nodeGiven: boolean): GlobalOptions {
  const o = validate(globalSchema, raw);
  return {
    store: parseStore(o.store)!,
    storeText: o.store,
    prefix: o.prefix,
    node: o.node,
    nodeGiven,
    ca: o.ca,
    cert: o.cert,
    key: o.key,
    tlsServerName: o.tlsServerName,
    user: o.user,
    password: o.password,
    timeoutMs: o.timeout,
    connectTimeoutMs: o.connectTimeout,
    leaseTtlMs: o.leaseTtl,
    pollMs: o.poll,
    clockSkewMs: o.clockSkew,
    min: o.min,
    max: o.max,
    json: o.json,
    progress: o.progress,
    debug: o.debug,
    verbose: o.verbose,
  };
}

/** Validates one duration flag of a command (`--every`, `--grace`). */
export function durationOption(flag: string, text: string, min = 0): number {
  return validate(z.object({ [flag]: duration(min) }), { [flag]: text })[flag] as number;
}

/** Validates one whole-number flag of a command (`--cluster-id`). */
export function integerOption(flag: string, text: string, min = 0): number {
  return validate(z.object({ [flag]: integer(min) }), { [flag]: text })[flag] as number;
}

/** An ID argument: a positive safe integer, else {@linkcode InvalidIdError}. */
export function parseIdArgument(text: string): number {
  const id = /^\d+$/.test(text.trim()) ? Number(text) : NaN;
  if (!Number.isSafeInteger(id) || id <= 0) {
    throw new InvalidIdError(`ID must be a positive whole number, got '${text}'`);
  }
  return id;
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
    return validate(
      z.object({
        prefix: z.array(z.union([z.string().min(1), z.number().finite()])).min(1),
      }),
      { prefix: parsed },
    ).prefix;
  }
  const parts = text.split("/");
  if (parts.some((p) => p === "")) {
    throw new InvalidOptionsError(
      `invalid option: --prefix '${text}' has an empty part (write a/b, or a JSON array)`,
    );
  }
  return parts;
}

/** The Deno KV prefix when `--prefix` is not given. */
export const DEFAULT_KV_PREFIX: readonly string[] = ["idalloc"];

/** A Deno KV prefix as the user would type it back: `a/b`, or JSON when that is ambiguous. */
export function formatKvPrefix(prefix: readonly Deno.KvKeyPart[]): string {
  const plain = prefix.every((p) => typeof p === "string" && p !== "" && !p.includes("/"));
  return plain && !String(prefix[0]).startsWith("[")
    ? prefix.join("/")
    : JSON.stringify(prefix, (_, v) => typeof v === "bigint" ? `${v}n` : v);
}
