/**
 * One parser for every options object idalloc takes (allocator, Deno KV and etcd backends,
 * identity allocator, the CLI's flags): strict zod schemas, and one voice for what is wrong —
 * `invalid <what>: '<option>' <problem>; …` — with zod's technical wording turned into plain words
 * and a misspelt option named with the option it most likely meant.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { z } from "zod";
 * import { parseOptions } from "./validate.ts";
 *
 * const schema = z.object({ pollIntervalMs: z.number().int().positive() }).strict();
 * assert.throws(() => parseOptions(schema, { pollIntervallMs: 5 }, "Deno KV backend options"), {
 *   name: "InvalidOptionsError",
 *   message: /'pollIntervallMs' is not an option \(did you mean 'pollIntervalMs'\?\)/,
 * });
 * ```
 *
 * @module
 */
import type { z } from "./deps/zod.ts";
import { InvalidOptionsError } from "./errors.ts";

/** How an option's path is named in messages: `'backoff.maxMs'` by default. */
export type OptionNamer = (path: readonly PropertyKey[]) => string;

const quoted: OptionNamer = (path) => `'${path.map(String).join(".")}'`;

/** Edit distance of two short strings (for "did you mean"). */
function distance(a: string, b: string): number {
  const row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    let prev = row[0];
    row[0] = i;
    for (let j = 1; j <= b.length; j++) {
      const next = Math.min(row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] === b[j - 1] ? 0 : 1));
      prev = row[j];
      row[j] = next;
    }
  }
  return row[b.length];
}

/** The known option closest to `key`, if it is close enough to be a typo. */
function closest(key: string, known: readonly string[]): string | undefined {
  let best: string | undefined;
  let bestDistance = Math.max(2, Math.floor(key.length / 4)) + 1;
  for (const candidate of known) {
    const d = distance(key.toLowerCase(), candidate.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [candidate, d];
  }
  return best;
}

/** The keys a (possibly refined or defaulted) object schema knows at `path`. */
function knownKeys(schema: z.ZodType, path: readonly PropertyKey[]): string[] {
  let current: unknown = schema;
  const unwrap = (s: unknown): unknown => {
    for (let i = 0; i < 8; i++) {
      const def = (s as { def?: { innerType?: unknown; in?: unknown; schema?: unknown } })?.def;
      const inner = def?.innerType ?? def?.in ?? def?.schema;
      if (inner === undefined) return s;
      s = inner;
    }
    return s;
  };
  for (const part of [...path, undefined]) {
    current = unwrap(current);
    const shape = (current as { shape?: Record<string, unknown> })?.shape;
    if (shape === undefined) return [];
    if (part === undefined) return Object.keys(shape);
    current = shape[String(part)];
  }
  return [];
}

/** One issue in plain words. */
function describeIssue(issue: z.core.$ZodIssue, schema: z.ZodType, name: OptionNamer): string[] {
  const where = issue.path.length > 0 ? name(issue.path) : undefined;
  switch (issue.code) {
    case "unrecognized_keys":
      return issue.keys.map((key) => {
        const guess = closest(key, knownKeys(schema, issue.path));
        const option = name([...issue.path, key]);
        return `${option} is not an option` + (guess ? ` (did you mean ${name([guess])}?)` : "");
      });
    case "invalid_type": {
      const subject = where ?? "the options";
      if (/received undefined/.test(issue.message)) return [`${subject} is required`];
      const expected = issue.expected === "int" ? "a whole number" : `a ${issue.expected}`;
      return [`${subject} must be ${expected}`];
    }
    case "too_small": {
      const subject = where ?? "the options";
      const min = Number(issue.minimum);
      if (issue.origin === "string" || issue.origin === "array") {
        return [min <= 1 ? `${subject} must not be empty` : `${subject} needs at least ${min}`];
      }
      return [`${subject} must be ${issue.inclusive ? "at least" : "greater than"} ${min}`];
    }
    case "too_big": {
      const subject = where ?? "the options";
      const max = Number(issue.maximum);
      if (issue.origin === "string" || issue.origin === "array") {
        return [`${subject} must be at most ${max} long`];
      }
      return [`${subject} must be ${issue.inclusive ? "at most" : "less than"} ${max}`];
    }
    default:
      return [where === undefined ? issue.message : `${where} ${issue.message}`];
  }
}

/**
 * Parses `input` with `schema`. On failure throws {@linkcode InvalidOptionsError} (the zod error
 * as `cause`) with every problem in one sentence: `invalid <what>: <problem>; <problem>`.
 *
 * @param schema a strict zod schema
 * @param input what the caller passed
 * @param what the options' name in messages, e.g. `allocator options`
 * @param name how an option is named (`'max'` by default; the CLI says `--max`)
 */
export function parseOptions<T>(
  schema: z.ZodType<T>,
  input: unknown,
  what: string,
  name: OptionNamer = quoted,
): T {
  if (input === null || typeof input !== "object") {
    throw new InvalidOptionsError(`invalid ${what}: expected an object`);
  }
  const parsed = schema.safeParse(input);
  if (parsed.success) return parsed.data;
  const detail = parsed.error.issues.flatMap((issue) => describeIssue(issue, schema, name));
  throw new InvalidOptionsError(`invalid ${what}: ${detail.join("; ")}`, { cause: parsed.error });
}
