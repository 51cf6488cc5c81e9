/**
 * What the nemesis processes write and read: the configuration a worker or the GC loop starts
 * with, and the JSON lines they log (one per resolved call, reassignment, GC pass…). Lines are
 * validated with zod when the orchestrator reads them back: a line that does not parse is a harness
 * bug and is reported, never silently dropped.
 *
 * @module
 */
import { z } from "zod";
import { IdallocError } from "../src/errors.ts";
import { LabelError } from "../src/identity/errors.ts";
import type { NemesisStoreSpec, NemesisTimings } from "../src/testing/nemesis.ts";

/**
 * How a nemesis process reaches the store: the backend's kind, and whatever that backend's harness
 * needs, which its own schema checks when it opens the store.
 */
export const storeSpecSchema: z.ZodType<NemesisStoreSpec> = z.looseObject({
  kind: z.string().min(1),
});

const rangeSchema = z.object({ min: z.number().int(), max: z.number().int() });

/** Allocator timings shared by every nemesis process. */
export const timingsSchema: z.ZodType<NemesisTimings> = z.object({
  leaseTtlMs: z.number().int().positive(),
  syncIntervalMs: z.number().int().positive(),
  gcIntervalMs: z.number().int().positive(),
  callTimeoutMs: z.number().int().positive(),
});

/** The JSON a worker process gets as its only argument. */
export const workerConfigSchema = z.object({
  store: storeSpecSchema,
  /** Node name (the store's reference suffix). */
  node: z.string().min(1),
  /** This process's incarnation: unique per start, so a restart under the same name is told apart. */
  inc: z.string().min(1),
  /** `allocator`: a plain `Allocator` on string keys; `identity`: an `IdentityAllocator`. */
  layer: z.enum(["allocator", "identity"]),
  seed: z.number().int(),
  /** The key family, most popular first (Zipf ranks). Identity keys are Cilium label strings. */
  keys: z.array(z.string().min(1)).min(1),
  range: rangeSchema,
  timings: timingsSchema,
  /** Concurrent call loops; one key is never in two loops of one worker at once. */
  lanes: z.number().int().positive(),
  /** Pause after each call, ms, drawn uniformly. */
  pauseMs: z.tuple([z.number().int().nonnegative(), z.number().int().nonnegative()]),
  /** Shares of allocate, release and get among the calls (the rest are store reads). */
  mix: z.object({
    allocate: z.number().min(0).max(1),
    release: z.number().min(0).max(1),
    get: z.number().min(0).max(1),
  }),
  /** Held keys above which releases become more likely. */
  targetHeld: z.number().int().positive(),
  /** Where the worker appends its JSON lines. */
  logPath: z.string().min(1),
});

/** The JSON a worker process gets as its only argument. */
export type WorkerConfig = z.infer<typeof workerConfigSchema>;

/** The JSON the GC loop process gets as its only argument. */
export const gcConfigSchema = z.object({
  store: storeSpecSchema,
  node: z.string().min(1),
  range: rangeSchema,
  timings: timingsSchema,
  logPath: z.string().min(1),
  /** The GC grace (`gcGraceMs`); absent: the allocator's default (or `NEMESIS_GC_GRACE_MS`). */
  gcGraceMs: z.number().int().nonnegative().optional(),
});

/** The JSON the GC loop process gets as its only argument. */
export type GcConfig = z.infer<typeof gcConfigSchema>;

/** The calls a worker makes. `resolve` is the identity layer's cache-then-store lookup. */
export const OPS = ["allocate", "release", "get", "getNoCache", "resolve"] as const;

/** A call a worker makes. */
export type Op = typeof OPS[number];

const who = { node: z.string(), inc: z.string() };

const callBase = {
  t: z.literal("call"),
  ...who,
  op: z.enum(OPS),
  key: z.string(),
  /** ms since the epoch, before the call was made. */
  start: z.number(),
  /** ms since the epoch, after it resolved. */
  end: z.number(),
};

/** One resolved call, successful. */
export const callOkSchema = z.object({
  ...callBase,
  ok: z.literal(true),
  /** The ID answered (allocate, get, getNoCache, resolve); absent for release or "no ID". */
  id: z.number().int().optional(),
  /** Whether the worker held the key for the whole call (so the answer came from its hold). */
  held: z.boolean(),
  firstUse: z.boolean().optional(),
  isNew: z.boolean().optional(),
  lastUse: z.boolean().optional(),
});

/** One resolved call, failed. */
export const callErrorSchema = z.object({
  ...callBase,
  ok: z.literal(false),
  held: z.boolean(),
  /** The error's `name`. */
  error: z.string(),
  message: z.string(),
  /** Whether it is one of idalloc's typed errors (an `IdallocError`, or a `LabelError`). */
  typed: z.boolean(),
  retryable: z.boolean(),
  /** Whether it is the reason of the call's own deadline signal. */
  deadline: z.boolean(),
});

/** Every line a worker or the GC loop writes. */
export const recordSchema = z.discriminatedUnion("t", [
  z.object({ t: z.literal("ready"), ...who, pid: z.number(), at: z.number() }),
  z.discriminatedUnion("ok", [callOkSchema, callErrorSchema]),
  z.object({
    t: z.literal("reassigned"),
    ...who,
    key: z.string(),
    oldId: z.number(),
    newId: z.number(),
    at: z.number(),
  }),
  z.object({
    t: z.literal("hang"),
    ...who,
    op: z.enum(OPS),
    key: z.string(),
    start: z.number(),
    at: z.number(),
  }),
  z.object({
    t: z.literal("holds"),
    ...who,
    at: z.number(),
    holds: z.record(z.string(), z.number()),
    /** Held keys still fenced (not re-checked yet), which answer no ID. */
    fenced: z.array(z.string()).optional(),
    /** Held keys the allocator itself counts (`status().heldKeys`), to cross-check the model. */
    heldKeys: z.number(),
    status: z.unknown(),
  }),
  z.object({
    t: z.literal("hb"),
    ...who,
    start: z.number(),
    end: z.number(),
    /** `[key, id]` of every held key the heartbeat read (an answer from the hold each). */
    ids: z.array(z.tuple([z.string(), z.number()])),
  }),
  z.object({ t: z.literal("drained"), ...who, at: z.number(), failures: z.number() }),
  z.object({
    t: z.literal("gc"),
    ...who,
    start: z.number(),
    end: z.number(),
    deleted: z.array(z.number()).optional(),
    marked: z.number().optional(),
    alive: z.number().optional(),
    error: z.string().optional(),
  }),
  z.object({ t: z.literal("note"), ...who, at: z.number(), text: z.string() }),
]);

/** Every line a worker or the GC loop writes. */
export type LogRecord = z.infer<typeof recordSchema>;
/** One resolved call. */
export type CallRecord = Extract<LogRecord, { t: "call" }>;
/** A successful call. */
export type CallOk = Extract<CallRecord, { ok: true }>;
/** A failed call. */
export type CallFailed = Extract<CallRecord, { ok: false }>;
/** A `reassigned` event a worker saw. */
export type ReassignedRecord = Extract<LogRecord, { t: "reassigned" }>;
/** A call still unresolved past its deadline. */
export type HangRecord = Extract<LogRecord, { t: "hang" }>;
/** A heartbeat: the IDs of every held key, read from the hold at once. */
export type HeartbeatRecord = Extract<LogRecord, { t: "hb" }>;
/** What a worker held once it stopped calling. */
export type HoldsRecord = Extract<LogRecord, { t: "holds" }>;
/** One GC pass. */
export type GcRecord = Extract<LogRecord, { t: "gc" }>;

/**
 * Parses a log file's text; lines that do not parse are returned separately. With `only`, lines
 * not containing it are skipped unread (e.g. `"t":"holds"` to find a few records in a long log).
 */
export function parseRecords(
  text: string,
  only?: string,
): { records: LogRecord[]; bad: string[] } {
  const records: LogRecord[] = [];
  const bad: string[] = [];
  for (const line of text.split("\n")) {
    if (line.trim() === "" || (only !== undefined && !line.includes(only))) continue;
    let json: unknown;
    try {
      json = JSON.parse(line);
    } catch {
      // A process killed mid-write leaves at most one partial last line.
      bad.push(line);
      continue;
    }
    const parsed = recordSchema.safeParse(json);
    if (parsed.success) records.push(parsed.data);
    else bad.push(line);
  }
  return { records, bad };
}

/** Appends JSON lines to a file with one synchronous write each, so a SIGKILL loses no resolved line. */
export class LineLog {
  readonly #file: Deno.FsFile;
  readonly #encoder = new TextEncoder();

  /** @param path the file, created or appended to */
  constructor(path: string) {
    this.#file = Deno.openSync(path, { append: true, create: true });
  }

  /** Writes one record as a line. */
  write(record: LogRecord): void {
    this.writeLine(JSON.stringify(record));
  }

  /** Writes one line of text as it is (a foreign program's output, kept raw as evidence). */
  writeLine(line: string): void {
    const bytes = this.#encoder.encode(line + "\n");
    let written = 0;
    while (written < bytes.length) written += this.#file.writeSync(bytes.subarray(written));
  }

  /** Closes the file. */
  close(): void {
    this.#file.close();
  }
}

/** The start of a call's record: who called what, when, and whether the key was held. */
export type CallStart = Pick<CallRecord, "t" | "node" | "inc" | "op" | "key" | "start" | "held">;

/** The record of a call that failed with `err`; `signal` is the call's own deadline. */
export function failedCall(call: CallStart, err: unknown, signal: AbortSignal): CallFailed {
  const e = err instanceof Error ? err : new Error(String(err));
  return {
    ...call,
    end: Date.now(),
    ok: false,
    error: e.name,
    message: e.message.slice(0, 500),
    typed: err instanceof IdallocError || err instanceof LabelError,
    retryable: err instanceof IdallocError && err.retryable,
    deadline: signal.aborted && err === signal.reason,
  };
}
