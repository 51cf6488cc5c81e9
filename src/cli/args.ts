/**
 * Validation of the CLI's options (zod, kept internal): durations, `--store`, `--prefix`, IDs and
 * the numeric knobs. Every failure is an {@linkcode InvalidOptionsError} naming the flag.
 *
 * @module
 */
import { z } from "../deps/zod.ts";
import { InvalidIdError } from "../errors.ts";
import { parseOptions } from "../validate.ts";
import { driverOf, storeSyntax } from "./stores/mod.ts";

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
  z.string().transform((s, ctx) => {
    const text = s.trim();
    if (!/^[+-]?\d+$/.test(text)) {
      ctx.addIssue({ code: "custom", message: `must be a whole number, got '${s}'` });
      return z.NEVER;
    }
    const n = Number(text);
    if (n < min) {
      ctx.addIssue({ code: "custom", message: `must be at least ${min}, got ${text}` });
      return z.NEVER;
    }
    if (!Number.isSafeInteger(n)) {
      ctx.addIssue({
        code: "custom",
        message: `must be at most ${Number.MAX_SAFE_INTEGER}, got ${text}`,
      });
      return z.NEVER;
    }
    return n;
  });

/** Options every command understands, after validation. */
export interface GlobalOptions {
  /** `--store` as given: `kv:<file>`, `etcd://…` (checked against the drivers). */
  readonly store: string;
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
  /** `--connect-timeout`, when given (else `--timeout` bounds connecting). */
  readonly connectTimeoutMs?: number;
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
    (s) => driverOf(s) !== undefined,
    { error: () => `must be ${storeSyntax()}` },
  ),
  prefix: z.string().min(1, "must not be empty").optional(),
  node: z.string().min(1, "must not be empty").max(253, "must be at most 253 characters")
    .refine((s) => !s.includes("/"), "must not contain '/'"),
  ca: z.string().min(1).optional(),
  cert: z.string().min(1).optional(),
  key: z.string().min(1).optional(),
  tlsServerName: z.string().min(1).optional(),
  user: z.string().min(1).optional(),
  password: z.string().optional(),
  timeout: duration(1),
  connectTimeout: duration(1).optional(),
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
    message: "and --key go together",
    path: ["cert"],
  })
  .refine((o) => (o.user === undefined) === (o.password === undefined), {
    message: "needs --password (or IDALLOC_ETCD_PASSWORD)",
    path: ["user"],
  });

/** `leaseTtl` → `--lease-ttl`. */
export function flagName(path: readonly PropertyKey[]): string {
  const name = String(path[0] ?? "options");
  return `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
}

/** Parses `input` with `schema`; throws `InvalidOptionsError` naming the flags. */
export function validate<T>(schema: z.ZodType<T>, input: unknown): T {
  return parseOptions(schema, input, "option", flagName);
}

/** Validates the global options commander collected (strings and booleans). */
export function globalOptions(raw: Record<string, unknown>, nodeGiven: boolean): GlobalOptions {
  const o = validate(globalSchema, raw);
  return {
    store: o.store,
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
  const trimmed = text.trim();
  if (!/^\d+$/.test(trimmed)) {
    throw new InvalidIdError(`an ID is a positive whole number, got '${text}'`);
  }
  const id = Number(trimmed);
  if (id === 0) throw new InvalidIdError("an ID is a positive whole number, got 0");
  if (!Number.isSafeInteger(id)) {
    throw new InvalidIdError(
      `ID ${trimmed} is too large: IDs go up to ${Number.MAX_SAFE_INTEGER}`,
    );
  }
  return id;
}
