/**
 * A counting semaphore across processes, on lock files: at most `limit` holders of one kind at
 * once among every process (and every test module: `deno test --parallel` runs modules side by
 * side in one process) that names the same directory. The test launcher
 * (`src/backends/k8s/testing/launcher.ts`) names one in {@linkcode SLOTS_ENV} for its run, so the
 * tests that need private servers (a kube-apiserver to kill, an etcd to restart) start only a few
 * at once; without it there is no cap.
 *
 * A slot is a file `<kind>.<pid>.<random>.slot`; a file whose process is gone is stale and
 * removed. Taking one is serialised by a guard directory (`mkdir` is atomic), so two takers never
 * both see a free slot. A holder that already holds a slot of the kind gets another at once: a
 * test that needs two servers at once must not wait for itself.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { mkdtempSync, readdirSync, rmSync } from "node:fs";
 * import { tmpdir } from "node:os";
 * import { join } from "node:path";
 * import { acquireSlot } from "./slots.ts";
 *
 * const dir = mkdtempSync(join(tmpdir(), "slots-"));
 * {
 *   using _slot = await acquireSlot("etcd", { dir, limit: 1 });
 *   assert.equal(readdirSync(dir).filter((f) => f.endsWith(".slot")).length, 1);
 * }
 * assert.deepEqual(readdirSync(dir).filter((f) => f.endsWith(".slot")), []);
 * rmSync(dir, { recursive: true });
 * ```
 * @module
 */
import { mkdirSync, readdirSync, rmdirSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import process from "node:process";

/** The environment variable naming the run's slot directory (set by the test launcher). */
export const SLOTS_ENV = "IDALLOC_TEST_SLOTS";

/** A held slot; release it once (disposing releases it). */
export interface Slot extends Disposable {
  /** Gives the slot back (idempotent). */
  release(): void;
}

/** Options of {@linkcode acquireSlot}. */
export interface AcquireSlotOptions {
  /** The slot directory. @default the directory named by {@linkcode SLOTS_ENV}, else no cap */
  readonly dir?: string;
  /** At most this many holders of the kind at once. */
  readonly limit: number;
  /** Give up after waiting this long. @default {600_000} */
  readonly timeoutMs?: number;
}

/** No slot came free in time: the holders (pid, file) are named. */
export class SlotTimeoutError extends Error {
  override readonly name = "SlotTimeoutError";
  /** The kind asked for. */
  readonly kind: string;
  constructor(kind: string, limit: number, waitedMs: number, holders: readonly string[]) {
    super(
      `no ${kind} slot came free in ${Math.round(waitedMs / 1000)} s (at most ${limit} at once; ` +
        `held by ${holders.join(", ") || "nobody"})`,
    );
    this.kind = kind;
  }
}

/** This module instance: one per test module, so two modules in one process are two holders. */
const HOLDER = `${process.pid}.${crypto.randomUUID().slice(0, 8)}`;

/** A guard older than this was left by a taker that died while holding it. */
const STALE_GUARD_MS = 10_000;

const delay = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // EPERM: it exists, owned by someone else.
    return (err as { code?: string }).code === "EPERM";
  }
}

const NOT_CAPPED: Slot = { release() {}, [Symbol.dispose]() {} };

/**
 * Takes one slot of `kind`, waiting while `limit` are held; without a slot directory (no
 * launcher) there is no cap and this returns at once. Throws {@linkcode SlotTimeoutError} after
 * `timeoutMs`.
 */
export async function acquireSlot(kind: string, options: AcquireSlotOptions): Promise<Slot> {
  const dir = options.dir ?? process.env[SLOTS_ENV];
  if (!dir) return NOT_CAPPED;
  if (!/^[a-z0-9-]+$/.test(kind)) throw new TypeError(`a slot kind is [a-z0-9-]+: '${kind}'`);
  const timeoutMs = options.timeoutMs ?? 600_000;
  const started = Date.now();
  for (let wait = 50;; wait = Math.min(wait * 2, 1000)) {
    const path = tryTake(dir, kind, options.limit);
    if (path !== undefined) return slotAt(path);
    const waited = Date.now() - started;
    if (waited > timeoutMs) {
      throw new SlotTimeoutError(
        kind,
        options.limit,
        waited,
        holders(dir, kind).map((h) => h.file),
      );
    }
    await delay(wait);
  }
}

function slotAt(path: string): Slot {
  let held = true;
  const release = () => {
    if (!held) return;
    held = false;
    try {
      unlinkSync(path);
    } catch {
      // the run's directory is gone already
    }
  };
  return { release, [Symbol.dispose]: release };
}

/** The live holders' files of `kind`; stale ones (their process gone) are removed. */
function holders(dir: string, kind: string): { file: string; holder: string }[] {
  const live = [];
  for (const file of readdirSync(dir)) {
    const m = /^([a-z0-9-]+)\.(\d+)\.([0-9a-f]+)\.\d+\.slot$/.exec(file);
    if (m === null || m[1] !== kind) continue;
    if (pidAlive(Number(m[2]))) live.push({ file, holder: `${m[2]}.${m[3]}` });
    else {
      try {
        unlinkSync(join(dir, file));
      } catch {
        // another taker removed it
      }
    }
  }
  return live;
}

let taken = 0;

/** Under the guard: a new slot file's path when one is free (or this holder has one). */
function tryTake(dir: string, kind: string, limit: number): string | undefined {
  const guard = join(dir, `${kind}.guard`);
  try {
    mkdirSync(guard);
  } catch (err) {
    if ((err as { code?: string }).code !== "EEXIST") throw err;
    try {
      if (Date.now() - statSync(guard).mtimeMs > STALE_GUARD_MS) rmdirSync(guard);
    } catch {
      // released meanwhile
    }
    return undefined;
  }
  try {
    const live = holders(dir, kind);
    if (live.length >= limit && !live.some((h) => h.holder === HOLDER)) return undefined;
    const path = join(dir, `${kind}.${HOLDER}.${++taken}.slot`);
    writeFileSync(path, "");
    return path;
  } finally {
    rmdirSync(guard);
  }
}
