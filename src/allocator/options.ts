/**
 * Validation of allocator options (zod, internal) and the resolved settings with defaults.
 *
 * @module
 */
import { z } from "../deps/zod.ts";
import { InvalidOptionsError } from "../errors.ts";
import { parseOptions } from "../validate.ts";
import type { SameShape, SettingsOf } from "../option_shape.ts";
import { type AllocatorOptions, type CacheValidator, type KeyCodec, stringCodec } from "./types.ts";

const safeInt = z.number().int().refine(Number.isSafeInteger, "must be a safe integer");

const optionsSchema = z.object({
  min: safeInt.min(1).default(1),
  max: safeInt.min(1),
  prefixMask: safeInt.min(0).default(0),
  codec: z.object({ encode: z.function(), decode: z.function() }).optional(),
  masterKeyProtection: z.boolean().default(true),
  leaseTtlMs: safeInt.min(500).max(86_400_000).default(60_000),
  syncIntervalMs: safeInt.min(10).default(60_000),
  maxAttempts: safeInt.min(1).max(10_000).default(16),
  lockWaitMs: safeInt.min(0).max(3_600_000).default(60_000),
  backoff: z.object({
    initialMs: z.number().min(0).default(20),
    maxMs: z.number().min(0).default(2_000),
    factor: z.number().min(1).default(2),
  }).prefault({}),
  gcIntervalMs: safeInt.min(10).optional(),
  gcGraceMs: safeInt.min(0).max(86_400_000).optional(),
  gcRateLimit: z.object({
    intervalMs: safeInt.min(1).default(60_000),
    burst: safeInt.min(1).default(2_500),
  }).prefault({}),
  validator: z.function().optional(),
  readOnly: z.boolean().default(false),
  restart: z.boolean().default(false),
  releaseInBackground: z.boolean().default(false),
}).strict().refine((o) => o.max > o.min, {
  message: "maximum ID must be greater than minimum ID",
  path: ["max"],
});

/**
 * Options after validation, with every default filled in: the schema's output (each option is
 * declared once, in the schema), with the caller's functions typed as given.
 */
export type AllocatorSettings<K> =
  & Omit<SettingsOf<typeof optionsSchema>, "codec" | "validator" | "gcGraceMs">
  & {
    readonly codec: KeyCodec<K>;
    readonly validator?: CacheValidator;
    readonly gcGraceMs: number;
  };

// The documented public interface must accept exactly what the schema does (functions aside,
// which zod checks only as functions): this line stops compiling when the two drift apart.
const _documentedAsValidated: SameShape<
  Omit<AllocatorOptions, "codec" | "validator">,
  Omit<z.input<typeof optionsSchema>, "codec" | "validator">
> = true;

/**
 * Validates `options`; throws {@linkcode InvalidOptionsError} naming every problem. `store` is the
 * backend: its `defaultGcGraceMs`, if any, is the grace's default.
 */
export function resolveOptions<K>(
  options: AllocatorOptions<K>,
  store: { readonly defaultGcGraceMs?: number } = {},
): AllocatorSettings<K> {
  if (options === null || typeof options !== "object") {
    throw new InvalidOptionsError("allocator options must be an object with at least 'max'");
  }
  if (options.max === undefined) {
    throw new InvalidOptionsError(
      "allocator option 'max' is required: an unbounded range is refused (Cilium's default max gives an empty pool)",
    );
  }
  const o = parseOptions(optionsSchema, options, "allocator options");
  return {
    ...o,
    // Passes faster than the lease — periodic, or `runGc()` in a caller's loop — would collect a
    // revoked or stalled holder's ID before it could notice; with passes a lease TTL apart the
    // grace costs nothing, since it counts from the pass that first found the ID unused.
    // A store with its own default (Kubernetes: Cilium operator's heartbeat timeout) never less.
    gcGraceMs: o.gcGraceMs ?? Math.max(o.leaseTtlMs, store.defaultGcGraceMs ?? 0),
    // zod checked the shapes; the functions themselves are the caller's, passed through untouched.
    codec: (options.codec ?? stringCodec) as KeyCodec<K>,
    validator: options.validator,
  };
}
