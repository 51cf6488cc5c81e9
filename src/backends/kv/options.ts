/**
 * Options of the Deno KV backend and their validation. Each option is declared once, in the
 * schema; the documented {@linkcode DenoKvBackendOptions} is checked against it at compile time
 * (see `src/option_shape.ts`).
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { InvalidOptionsError } from "../../errors.ts";
import { MAX_KEY_BYTES } from "./limits.ts";
import { prefixFits } from "./layout.ts";
import { isKvU64Class } from "./schema.ts";
import { parseOptions } from "../../validate.ts";
import type { SameShape, SettingsOf } from "../../option_shape.ts";

/** Options of {@linkcode DenoKvBackend}. */
export interface DenoKvBackendOptions {
  /** Namespace of every key the backend writes: non-empty strings and finite numbers, at least one. */
  readonly prefix: readonly (string | number)[];
  /** This node's name: non-empty, at most 253 characters, no `/`. */
  readonly node: string;
  /**
   * How often a watch polls the change counter, in ms. Needed because `kv.watch` does not fire
   * for writes of another process on a local file; in-process writes wake the watch at once. At
   * least 10 ms.
   * @default {1000}
   */
  readonly pollIntervalMs?: number;
  /** How often a watch re-lists every master as a safety net, in ms. @default {300000} */
  readonly resyncIntervalMs?: number;
  /**
   * The largest difference between two nodes' clocks, in ms. Lease expiry is judged with this
   * margin, and a lease is never renewed this close to its expiry.
   * @default {5000}
   */
  readonly maxClockSkewMs?: number;
  /**
   * How long change-feed entries are kept, in ms. A watcher that falls further behind re-lists.
   * @default {600000}
   */
  readonly logRetentionMs?: number;
  /**
   * Group commit: acquisitions and releases that arrive while a commit is in flight share the
   * next one (a failed check makes each member commit once more on its own). Off: one commit each.
   * @default {true}
   */
  readonly groupCommit?: boolean;
  /** The clock, in ms since the epoch (injected by tests). @default {Date.now} */
  readonly now?: () => number;
  /**
   * The counter class of `kv`'s implementation. Under Deno it is `Deno.KvU64` (the default). On
   * Node.js, where `kv` comes from the `@deno/kv` npm package's `openKv`, pass that package's
   * `KvU64` export.
   * @default {Deno.KvU64}
   */
  readonly kvU64?: KvU64Class;
}

/** A `KvU64` class: `Deno.KvU64`, or the one of the `@deno/kv` package. */
export type KvU64Class = new (value: bigint) => Deno.KvU64;

/** The shortest poll interval, in ms: a faster poll is a busy loop against the store. */
export const MIN_POLL_INTERVAL_MS = 10;

const positiveMs = z.number().int().positive();

/**
 * The options a store description carries too (`store_description.ts`), each with its one set of
 * bounds: the options schema and the description's are both made of these.
 */
export const kvFields = {
  prefix: z.array(z.union([z.string().min(1), z.number().finite()])).min(1),
  pollIntervalMs: z.number().int().min(MIN_POLL_INTERVAL_MS),
  maxClockSkewMs: z.number().int().nonnegative(),
};

const optionsSchema = z.object({
  prefix: kvFields.prefix,
  node: z.string().min(1).max(253).refine((s) => !s.includes("/"), "must not contain '/'"),
  pollIntervalMs: kvFields.pollIntervalMs.default(1000),
  resyncIntervalMs: positiveMs.default(300_000),
  maxClockSkewMs: kvFields.maxClockSkewMs.default(5000),
  logRetentionMs: positiveMs.default(600_000),
  groupCommit: z.boolean().default(true),
  now: z.custom<() => number>((v) => typeof v === "function", "must be a function")
    .default(() => Date.now),
  kvU64: z.custom<KvU64Class>(
    isKvU64Class,
    "must be a KvU64 class (Deno.KvU64, or the KvU64 export of @deno/kv)",
  ).optional(),
}).strict().refine((o) => prefixFits(o.prefix, o.node), {
  message: `prefix and node leave no room for keys under the ${MAX_KEY_BYTES}-byte key limit`,
  path: ["prefix"],
}).refine((o) => o.logRetentionMs >= 2 * (o.pollIntervalMs + o.maxClockSkewMs), {
  message: "must be at least twice pollIntervalMs + maxClockSkewMs",
  path: ["logRetentionMs"],
});

/** Options after validation, with defaults applied: the schema's output, so declared once. */
export type KvSettings = SettingsOf<typeof optionsSchema>;

// Does not compile when the documented options and the schema drift apart.
const _documentedAsValidated: SameShape<DenoKvBackendOptions, z.input<typeof optionsSchema>> = true;

/** Validates `options`; throws {@linkcode InvalidOptionsError} with the details as `cause`. */
export function resolveKvOptions(kv: unknown, options: unknown): KvSettings {
  if (
    typeof kv !== "object" || kv === null ||
    typeof (kv as Partial<Deno.Kv>).atomic !== "function"
  ) {
    throw new InvalidOptionsError("invalid Deno KV backend: 'kv' must be a Deno.Kv");
  }
  return parseOptions(optionsSchema, options, "Deno KV backend options");
}

/** `Deno.KvU64` when this is Deno (with `--unstable-kv`), else `undefined`. */
export function denoKvU64(): KvU64Class | undefined {
  return (globalThis as { Deno?: typeof Deno }).Deno?.KvU64;
}

/**
 * The counter class the backend writes with: the `kvU64` option, else `Deno.KvU64`. Outside Deno
 * there is no default: an `@deno/kv` store needs its own class, and a wrong one would be stored
 * as a plain object that no later `sum` accepts.
 */
export function resolveKvU64(settings: KvSettings): KvU64Class {
  const KvU64 = (settings.kvU64 as KvU64Class | undefined) ?? denoKvU64();
  if (KvU64 === undefined) {
    throw new InvalidOptionsError(
      "invalid Deno KV backend options: outside Deno, pass 'kvU64': the KvU64 export of the " +
        "@deno/kv package that opened 'kv' (import { KvU64, openKv } from \"@deno/kv\")",
    );
  }
  return KvU64;
}
