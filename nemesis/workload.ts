/**
 * The workloads a nemesis run can put on the cluster: timings, the plain key family, its ID range
 * and the mix of calls the workers make.
 *
 * - `default`: 200 plain keys over 320 IDs, GC every second, leases of 3 s: many keys, room to
 *   spare, so every fault plays out against a busy but not crowded store.
 * - `keyside`: the crowded shape that finds a key told two IDs at once after a stall — 60 keys
 *   skewed to the first ones over 80 IDs (1–80), half the calls allocations and a third releases
 *   with 0–20 ms pauses, GC every 500 ms; on Deno KV leases of 1.5 s with 200 ms of clock slack
 *   and 200 ms polls, on etcd leases of 3 s. Collected IDs are handed to other keys within a
 *   second, and a stalled holder's key is soon allocated again by another node. A fault starts
 *   every 2–4 s whether the last one ended or not (a stall lasts 4–9 s), so faults overlap.
 *
 * @module
 */
import type { NemesisWorkload } from "../src/testing/nemesis.ts";

/** Names of the workloads. */
export const WORKLOADS = ["default", "keyside"] as const;

/** A workload's name. */
export type WorkloadName = typeof WORKLOADS[number];

/**
 * The share of each call a worker lane makes. `release` falls back to `allocate` when the worker
 * holds nothing; `get` reads a held key four times in five; the rest (`read`) bypasses the hold.
 */
export interface CallMix {
  readonly allocate: number;
  readonly release: number;
  readonly get: number;
}

/**
 * Everything a run's processes take from the workload; a backend's hooks see its name, timings
 * and clock slack (which the drain waits for too).
 */
export interface Workload extends NemesisWorkload {
  readonly name: WorkloadName;
  /** The plain key family, most popular first. */
  readonly plainKeys: readonly string[];
  /** The plain workers' ID range. */
  readonly plainRange: { readonly min: number; readonly max: number };
  readonly mix: CallMix;
  /** Pause after each call, ms, drawn uniformly. */
  readonly pauseMs: readonly [number, number];
  /**
   * Start a fault every `[min, max]` ms, overlapping those still running; unset: one fault at a
   * time, 1–3 s apart.
   */
  readonly faultEveryMs?: readonly [number, number];
  /**
   * Whether `plainKeys` is already in popularity order; otherwise the run shuffles it, so that
   * popularity does not follow the numbering.
   */
  readonly ranked?: boolean;
}

/** The key-side workload's family: `k0;` … `k59;`. */
export function keysideKeys(n = 60): string[] {
  return Array.from({ length: n }, (_, i) => `k${i};`);
}

/**
 * The Cilium worker's key family: its labels `k8s:app=k<n>` (n < `n`, skewed to low n) as
 * Cilium's kvstore label string (`GlobalIdentity.GetKey()`: `source:key=value;`), which is the key
 * it stores, most popular first.
 */
export function ciliumKeys(n: number): string[] {
  return Array.from({ length: n }, (_, i) => `k8s:app=k${i};`);
}

/**
 * `w` beside Cilium nodes (`--cilium N`): the same number of plain keys, but Cilium's family, so
 * that both sides allocate the same keys, and the same keys are the popular ones on both sides.
 */
export function withCiliumKeys(w: Workload): Workload {
  return { ...w, plainKeys: ciliumKeys(w.plainKeys.length), ranked: true, cilium: true };
}

/**
 * The workload `name`, with the default family and range given by the caller. A backend's harness
 * adjusts its timings further (`NemesisHooks.timings`).
 */
export function workloadOf(
  name: WorkloadName,
  defaults: Omit<Workload, "name" | "mix" | "pauseMs">,
): Workload {
  if (name === "default") {
    return {
      ...defaults,
      name,
      mix: { allocate: 0.4, release: 0.22, get: 0.26 },
      pauseMs: [5, 40],
    };
  }
  return {
    name,
    timings: { ...defaults.timings, gcIntervalMs: 500 },
    clockSkewMs: 200,
    plainKeys: keysideKeys(),
    plainRange: { min: 1, max: 80 },
    mix: { allocate: 0.5, release: 0.35, get: 0.15 },
    pauseMs: [0, 20],
    faultEveryMs: [2_000, 4_000],
  };
}
