/**
 * A Deno KV store as idalloc's tools name it: `--store kv:<file>` (or a KV Connect URL, or
 * `:memory:`), `--prefix` as `a/b` or a JSON array of strings and numbers, and the backend's own
 * options `--poll` and `--clock-skew`. {@linkcode describeKvStore} turns them into a
 * {@linkcode KvStoreDescription}, which `./driver.ts` opens.
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { InvalidOptionsError } from "../../errors.ts";
import type { StoreContext, StoreOption } from "../driver.ts";
import { durationFlag, formatDuration, validateFlags } from "../driver_options.ts";
import { kvFields } from "./options.ts";
import { callerPath } from "../../caller_path.ts";

/** The Deno KV prefix when `--prefix` is not given. */
export const DEFAULT_KV_PREFIX: readonly string[] = ["idalloc"];

/** One Deno KV store, completely: where it is, its namespace and the backend's timing. */
export interface KvStoreDescription {
  /** A file path (a relative one already resolved for the caller), a KV Connect URL or `:memory:`. */
  readonly path: string;
  /** The key prefix every entry lives under. */
  readonly prefix: readonly (string | number)[];
  /** How often a node polls the change feed, in ms. */
  readonly pollIntervalMs: number;
  /** The largest clock difference between nodes, in ms. */
  readonly maxClockSkewMs: number;
}

/**
 * The schema of {@linkcode KvStoreDescription}: the backend's options schema decides what a
 * prefix, a poll interval and a clock skew may be (`kvFields`), so both refuse the same values in
 * the same words.
 */
export const kvStoreDescription: z.ZodType<KvStoreDescription> = z.object({
  path: z.string().min(1),
  prefix: kvFields.prefix,
  pollIntervalMs: kvFields.pollIntervalMs,
  maxClockSkewMs: kvFields.maxClockSkewMs,
}).strict();

/** `--poll` and `--clock-skew`: the backend's own CLI options. */
export const KV_OPTIONS: readonly StoreOption[] = [
  { flags: "--poll <duration>", description: "change poll interval", default: "1s" },
  {
    flags: "--clock-skew <duration>",
    description: "largest clock difference between nodes",
    default: "5s",
  },
];

const kvValues = z.object({
  poll: durationFlag(kvFields.pollIntervalMs.minValue!),
  clockSkew: durationFlag(kvFields.maxClockSkewMs.minValue!),
});

/** The Deno KV prefix of `--prefix`: `a/b` → `["a", "b"]`, or a JSON array such as `["a", 1]`. */
export function kvPrefix(text: string | undefined): (string | number)[] {
  if (text === undefined) return [...DEFAULT_KV_PREFIX];
  if (text.trimStart().startsWith("[")) return jsonPrefix(text);
  const parts = text.split("/");
  if (parts.some((p) => p === "")) {
    throw new InvalidOptionsError(
      `invalid option: --prefix '${text}' has an empty part (write a/b, or a JSON array)`,
    );
  }
  return parts;
}

function jsonPrefix(text: string): (string | number)[] {
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

/** Whether `path` names a file on this machine (not `:memory:`, not a KV Connect URL). */
export function isLocalFile(path: string): boolean {
  return path !== ":memory:" && !/^https?:\/\//.test(path);
}

/**
 * The description of `--store kv:<rest>` with `--prefix` and the backend's options; throws
 * `InvalidOptionsError` naming the flag.
 */
export function describeKvStore(
  rest: string,
  values: Readonly<Record<string, unknown>>,
  context: StoreContext,
): KvStoreDescription {
  const { poll, clockSkew } = validateFlags(kvValues, values);
  const prefix = kvPrefix(context.prefix);
  if (context.leaseTtlMs < 2 * clockSkew) {
    // Deno KV judges leases with the skew margin on both sides.
    throw new InvalidOptionsError(
      `invalid option: --lease-ttl (${formatDuration(context.leaseTtlMs)}) must be at least ` +
        `twice --clock-skew (${formatDuration(clockSkew)}) on Deno KV`,
    );
  }
  return {
    path: isLocalFile(rest) ? callerPath(rest) : rest,
    prefix,
    pollIntervalMs: poll,
    maxClockSkewMs: clockSkew,
  };
}
