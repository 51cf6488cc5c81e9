/**
 * Shapes of the values the backend reads from the store. Anything that does not match is a
 * corrupt or foreign entry: it is logged and treated as unusable, never trusted and never
 * overwritten blindly.
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { shorten } from "../../allocator/damage.ts";
import { idallocLogger } from "../../log.ts";

const log = idallocLogger("kv");

const idSchema = z.number().int().nonnegative();

const masterSchema = z.object({ key: z.string().min(1) });
const keyIndexSchema = z.object({ id: idSchema });
const refSchema = z.object({ id: idSchema, lease: z.string().min(1) });
const leaseSchema = z.object({ lease: z.string().min(1), expiresAt: z.number().finite() });
const logSchema = z.object({ id: idSchema, key: z.string().min(1).nullable() });

/** Value of a master `[...P, "id", N]`. */
export type MasterValue = z.infer<typeof masterSchema>;
/** Value of a key index `[...P, "key", k]`. */
export type KeyIndexValue = z.infer<typeof keyIndexSchema>;
/** Value of a reference `[...P, "ref", k, node]`. */
export type RefValue = z.infer<typeof refSchema>;
/** Value of a lease record `[...P, "lease", node]`. */
export type LeaseValue = z.infer<typeof leaseSchema>;
/** Value of a change-feed entry `[...P, "log", ms, node, nonce]`. */
export type LogValue = z.infer<typeof logSchema>;

/** What a value can be read as. */
export type ValueKind = "master" | "key index" | "reference" | "lease" | "log entry";

const schemas: Record<ValueKind, z.ZodType> = {
  "master": masterSchema,
  "key index": keyIndexSchema,
  "reference": refSchema,
  "lease": leaseSchema,
  "log entry": logSchema,
};

/** Decoders: each returns the typed value, or `undefined` (logged) for a corrupt entry. */
export const decode = {
  master: (e: Deno.KvEntry<unknown>): MasterValue | undefined => parse(e, "master"),
  keyIndex: (e: Deno.KvEntry<unknown>): KeyIndexValue | undefined => parse(e, "key index"),
  ref: (e: Deno.KvEntry<unknown>): RefValue | undefined => parse(e, "reference"),
  lease: (e: Deno.KvEntry<unknown>): LeaseValue | undefined => parse(e, "lease"),
  log: (e: Deno.KvEntry<unknown>): LogValue | undefined => parse(e, "log entry"),
};

/** The same decoders without logging, for the damage report (which lists what it finds). */
export const peek = {
  master: (value: unknown): MasterValue | undefined => quiet(value, "master"),
  keyIndex: (value: unknown): KeyIndexValue | undefined => quiet(value, "key index"),
  ref: (value: unknown): RefValue | undefined => quiet(value, "reference"),
  lease: (value: unknown): LeaseValue | undefined => quiet(value, "lease"),
  log: (value: unknown): LogValue | undefined => quiet(value, "log entry"),
};

function parse<T>(entry: Deno.KvEntry<unknown>, kind: ValueKind): T | undefined {
  const result = schemas[kind].safeParse(entry.value);
  if (result.success) return result.data as T;
  corrupt(entry.key, `bad ${kind} value`, result.error);
  return undefined;
}

function quiet<T>(value: unknown, kind: ValueKind): T | undefined {
  const result = schemas[kind].safeParse(value);
  return result.success ? result.data as T : undefined;
}

/** Logs a corrupt entry that is being skipped. */
export function corrupt(key: Deno.KvKey, why: string, cause?: unknown): void {
  log.warning("skipping corrupt entry {key}: {why}", {
    key: formatKey(key),
    why,
    cause: cause instanceof z.ZodError ? z.prettifyError(cause) : cause,
  });
}

/** A key in a readable form for logs and error messages (huge parts shortened). */
export function formatKey(key: Deno.KvKey): string {
  const part = (p: Deno.KvKeyPart) =>
    typeof p === "string"
      ? JSON.stringify(shorten(p))
      : p instanceof Uint8Array
      ? `<${p.length} bytes>`
      : typeof p === "bigint"
      ? `${p}n`
      : String(p);
  return `[${key.map(part).join(", ")}]`;
}

/**
 * Whether `value` is a KV counter: a `Deno.KvU64`, or on Node.js one of the `@deno/kv` package's
 * (another class, named `_KvU64` there), so no `instanceof`. Decoded user data is never a class
 * instance (values are structured clones), so the name and the `bigint` field suffice.
 */
export function isKvU64(value: unknown): value is Deno.KvU64 {
  return typeof value === "object" && value !== null && isKvU64Class(value.constructor) &&
    typeof (value as { value?: unknown }).value === "bigint";
}

/** Whether `value` is a `KvU64` class (Deno's or `@deno/kv`'s, see {@linkcode isKvU64}). */
export function isKvU64Class(value: unknown): boolean {
  return typeof value === "function" && /^_?KvU64$/.test(value.name);
}

/** The counter's value if `entry` holds a `Deno.KvU64`, else `undefined`. */
export function counterValue(entry: Deno.KvEntryMaybe<unknown>): bigint | undefined {
  return isKvU64(entry.value) ? entry.value.value : undefined;
}
