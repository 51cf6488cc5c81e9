/**
 * The vocabulary of command-line options, shared by the CLI's common options and every driver's
 * own (`BackendDriver.options`): durations as people type them (`500ms`, `5s`, `15m`),
 * and validation whose messages name the flag (`--connect-timeout`), not the attribute.
 *
 * @module
 */
import { z } from "../deps/zod.ts";
import { parseOptions } from "../validate.ts";
import type { StoreOption } from "./driver.ts";

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

/** A duration flag of at least `min` ms, as a zod schema from the typed text to milliseconds. */
export function durationFlag(min: number): z.ZodType<number, string> {
  return z.string()
    .refine((s) => parseDuration(s) !== undefined, "must be a duration such as 500ms, 5s, 15m, 1h")
    .transform((s) => parseDuration(s)!)
    .refine((ms) => ms >= min, `must be at least ${formatDuration(min)}`);
}

/** `leaseTtl` → `--lease-ttl`: commander's attribute name back to the flag. */
export function flagName(path: readonly PropertyKey[]): string {
  const name = String(path[0] ?? "options");
  return `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`;
}

/** Parses flag values with `schema`; throws `InvalidOptionsError` naming the flags. */
export function validateFlags<T>(schema: z.ZodType<T>, input: unknown): T {
  return parseOptions(schema, input, "option", flagName);
}

/** The long flag of `option`: `--tls-server-name` of `--tls-server-name <name>`. */
export function longFlag(option: StoreOption): string {
  return option.flags.split(/[ ,|]+/).find((f) => f.startsWith("--"))!;
}

/** Commander's attribute name of `option`: `tlsServerName` for `--tls-server-name`. */
export function attributeName(option: StoreOption): string {
  return longFlag(option).slice(2).replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}
