/**
 * This process's clock against the API server's. Every write of the node's Lease answers with the
 * server's time of that write (the `time` of the object's `managedFields` entry it updated — each
 * write sets the one of {@linkcode STAMP_ANNOTATIONS} the Lease does not carry, so that the server
 * stamps it — and `creationTimestamp` on create; whole seconds), so each write bounds the offset
 * `server − local`: the server wrote at some instant between sending and receiving, within the
 * second it names. {@linkcode ServerClock} keeps the bounds of the last few writes and uses, as
 * the offset, the value nearest to zero they allow: a clock the writes show in step is left exactly
 * as it is, a slow or fast one is corrected to within a second and a round trip.
 *
 * - A **holder** writes its Lease's `renewTime` corrected, so others judge it on the server's time.
 * - A **judge** reads every Lease's end on its own clock corrected (`liveness.ts`), and also trusts
 *   the server's own time of the Lease's last renewal (a holder that measured nothing, an older
 *   version): a node whose clock is slow is never judged lapsed while it renews.
 * - A node whose offset passes `maxClockSkewMs` is warned about; past
 *   {@linkcode clockSkewBound} (the skew the key claims' quiet rule allows, `claim.ts`, which is
 *   judged on the writers' own clocks) a session refuses to open ({@linkcode ClockSkewError}).
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { ServerClock } from "./clock.ts";
 *
 * let local = 1_000_000;
 * const clock = new ServerClock(() => local);
 * assert.equal(clock.offset, 0);
 * // Sent at 1 000 000, answered at 1 000 040; the server wrote within its second 1 030 000.
 * clock.sample(1_030_000, 1_000_000, 1_000_040);
 * assert.equal(clock.offset, 1_030_000 - 1_000_040);
 * assert.equal(clock.now(), local + clock.offset);
 * ```
 *
 * @module
 */
import { IdallocError } from "../../errors.ts";
import type { KubeObject } from "./kube.ts";

/**
 * Two annotations a node Lease's writes alternate between. The API server stamps a write's time
 * into `managedFields` only when the writer's set of fields changes, not when only values do (a
 * renewal's `renewTime`): adding one and removing the other makes every write change that set —
 * provided the write adds the one the stored Lease lacks, which the writer reads from the version
 * its write is guarded by (`lease.ts`), not from a count of its own writes (a restarted process,
 * a retry after a refused write).
 */
export const STAMP_ANNOTATIONS = ["idalloc.io/stamp-a", "idalloc.io/stamp-b"] as const;

/** How many recent writes bound the offset (older ones may predate a clock step). */
const SAMPLES = 5;

/** The server's times are whole seconds. */
export const SERVER_TIME_RESOLUTION_MS = 1_000;

/** Bounds of `server − local`, in ms. */
export interface OffsetBounds {
  /** The lowest offset the write allows. */
  readonly lo: number;
  /** The highest offset the write allows. */
  readonly hi: number;
}

/**
 * This node's clock is too far from the API server's for the protocol's clock-judged rules (see
 * the module doc). Not retryable: set the machine's clock (NTP), or raise `maxClockSkewMs`.
 */
export class ClockSkewError extends IdallocError {
  /** The measured offset, `server − local`, in ms. */
  readonly offsetMs: number;

  /**
   * Creates the error.
   *
   * @param node the node
   * @param offsetMs the measured offset
   * @param boundMs the largest offset allowed
   */
  constructor(node: string, offsetMs: number, boundMs: number) {
    super(
      `the clock of node ${node} is ${describeOffset(offsetMs)} the API server's, more than ` +
        `the ${boundMs} ms the key claims allow (half the heartbeat timeout less half the lease ` +
        "TTL, plus maxClockSkewMs): set this machine's clock (NTP)",
    );
    this.name = "ClockSkewError";
    this.offsetMs = offsetMs;
  }
}

/** `12.3 s behind` / `4.0 s ahead of`. */
export function describeOffset(offsetMs: number): string {
  const seconds = (Math.abs(offsetMs) / 1000).toFixed(1);
  return offsetMs > 0 ? `${seconds} s behind` : `${seconds} s ahead of`;
}

/**
 * The largest offset a node may run with: a claim is removed once its last write looks older than
 * half the heartbeat timeout plus the skew margin, and a node may be between its claim write and
 * its identity create for half its lease TTL (`claim.ts`).
 */
export function clockSkewBound(
  settings: { readonly heartbeatTimeoutMs: number; readonly maxClockSkewMs: number },
  leaseTtlMs: number,
): number {
  return Math.floor(settings.heartbeatTimeoutMs / 2 - leaseTtlMs / 2) + settings.maxClockSkewMs;
}

/**
 * The server's time of the write that returned `obj`: the latest of its `managedFields` times and
 * its `creationTimestamp` (whole seconds), or `undefined` when it carries none.
 */
export function serverTimeOf(obj: KubeObject): number | undefined {
  const times = [
    parseTime(obj.metadata.creationTimestamp),
    ...managedFields(obj).map((entry) => parseTime(entry.time)),
  ].filter((t): t is number => t !== undefined);
  return times.length === 0 ? undefined : Math.max(...times);
}

/**
 * The server's time (whole seconds) of the last write of a Lease's `spec.renewTime`: the
 * `managedFields` entry that owns it. `undefined` when none does (a server that keeps no managed
 * fields).
 */
export function serverRenewTimeOf(obj: KubeObject): number | undefined {
  let latest: number | undefined;
  for (const entry of managedFields(obj)) {
    const spec = (entry.fieldsV1 as Record<string, unknown> | undefined)?.["f:spec"];
    if (typeof spec !== "object" || spec === null || !("f:renewTime" in spec)) continue;
    const time = parseTime(entry.time);
    if (time !== undefined && (latest === undefined || time > latest)) latest = time;
  }
  return latest;
}

interface ManagedFieldsEntry {
  readonly time?: unknown;
  readonly fieldsV1?: unknown;
}

/** ms since the epoch of an RFC 3339 time, or `undefined` (layout.ts imports this module). */
function parseTime(text: unknown): number | undefined {
  if (typeof text !== "string" || !/^\d{4}-\d\d-\d\dT/.test(text)) return undefined;
  const ms = Date.parse(text);
  return Number.isFinite(ms) ? ms : undefined;
}

function managedFields(obj: KubeObject): ManagedFieldsEntry[] {
  const entries = (obj.metadata as { managedFields?: unknown }).managedFields;
  return Array.isArray(entries) ? entries as ManagedFieldsEntry[] : [];
}

/** The offset between this process's clock (the backend's `now`) and the API server's. */
export class ServerClock {
  readonly #local: () => number;
  #samples: OffsetBounds[] = [];
  #offset = 0;

  /** @param local this process's clock (the backend's `now` option) */
  constructor(local: () => number) {
    this.#local = local;
  }

  /** `server − local` in ms: 0 until measured, and while the writes allow 0. */
  get offset(): number {
    return this.#offset;
  }

  /** Whether a write has measured the offset. */
  get measured(): boolean {
    return this.#samples.length > 0;
  }

  /** The server's time now, as this process best knows it. */
  now(): number {
    return this.#local() + this.#offset;
  }

  /**
   * Records a write the server made at `serverTime` (its whole second), sent at `sentAt` and
   * answered at `receivedAt` (this process's clock). Returns the new offset.
   */
  sample(serverTime: number, sentAt: number, receivedAt: number): number {
    const bounds = {
      lo: serverTime - receivedAt,
      hi: serverTime + SERVER_TIME_RESOLUTION_MS - sentAt,
    };
    this.#samples = [...this.#samples.slice(-(SAMPLES - 1)), bounds];
    let lo = -Infinity;
    let hi = Infinity;
    for (const s of this.#samples) {
      lo = Math.max(lo, s.lo);
      hi = Math.min(hi, s.hi);
    }
    if (lo > hi) {
      // The clock stepped (or a sample was wrong): only the newest write counts from now on.
      this.#samples = [bounds];
      ({ lo, hi } = bounds);
    }
    this.#offset = lo > 0 ? lo : hi < 0 ? hi : 0;
    return this.#offset;
  }
}
