/**
 * The backends the nemesis suite runs on: every backend in the registry, then the stores composed
 * of them (`./composed.ts`: the double-write store), with the hooks of their harnesses, loaded once
 * when this module is; and the fault and garbage kinds they offer, which the command line, the
 * scheduling and the report take from here. Nothing else in `nemesis/` lists backends, faults of a
 * store or garbage kinds.
 *
 * @module
 */
import { HarnessLoadError, loadHarnesses, UnknownBackendError } from "../src/testing/harness.ts";
import type { ComposedHarness } from "../src/testing/harness_contract.ts";
import { NEMESIS_FAULTS, type NemesisHooks } from "../src/testing/nemesis.ts";
import { COMPOSED_KINDS, loadComposed } from "./composed.ts";

/** One backend as the nemesis suite knows it. */
export interface NemesisBackend {
  /** Its kind (`--backend`). */
  readonly kind: string;
  /** Why it cannot run here, or `undefined` when it can. */
  unavailable(): string | undefined;
  /** What the suite does on it. */
  readonly hooks: NemesisHooks;
}

/** A backend's or a composed store's harness, as the suite uses it. */
function nemesisBackend(h: ComposedHarness): NemesisBackend {
  return {
    kind: h.kind,
    // The backend's own reason first (no binary here), then its nemesis hooks' (not built).
    unavailable: () => h.unavailable() ?? h.nemesis.unavailable?.(),
    hooks: checked(h.kind, h.nemesis),
  };
}

/** Every backend, in the registry's order, then the composed stores. */
export const NEMESIS_BACKENDS: readonly NemesisBackend[] = [
  ...await loadHarnesses(),
  ...await Promise.all(COMPOSED_KINDS.map((kind) => loadComposed(kind)!)),
].map(nemesisBackend);

/** The kinds `--backend` takes, in the registry's order, then the composed stores. */
export const BACKEND_KINDS: readonly string[] = NEMESIS_BACKENDS.map((b) => b.kind);

/**
 * The registry's kinds whose nemesis hooks are built (a backend's hooks may say they are not
 * yet), in its order: what `--backend all` runs, and what the fault and time figures cover. A
 * composed store runs only when named (`--backend doublewrite`): its sides run on their own.
 */
export const RUN_KINDS: readonly string[] = NEMESIS_BACKENDS
  .filter((b) => !COMPOSED_KINDS.includes(b.kind) && b.hooks.unavailable?.() === undefined)
  .map((b) => b.kind);

/** The nemesis hooks of backend `kind`; throws `UnknownBackendError` for a kind not registered. */
export function hooksOf(kind: string): NemesisHooks {
  const backend = NEMESIS_BACKENDS.find((b) => b.kind === kind);
  if (!backend) throw new UnknownBackendError(kind);
  return backend.hooks;
}

/** Every fault kind backend `kind` offers: the nemesis's own it takes, then its store's own. */
export function faultKindsOf(kind: string): string[] {
  const hooks = hooksOf(kind);
  return [...hooks.faults, ...Object.keys(hooks.storeFaults ?? {})];
}

/** Every fault kind some backend offers, in the order of `BACKEND_KINDS` (`--faults all`). */
export const FAULT_KINDS: readonly string[] = union(BACKEND_KINDS.map(faultKindsOf));

/** Every garbage kind some backend's store can hold, in the registry's order. */
export const GARBAGE_KINDS: readonly string[] = union(
  NEMESIS_BACKENDS.map((b) => b.hooks.garbageKinds),
);

/** The distinct items of `lists`, in the order they first appear. */
function union(lists: readonly (readonly string[])[]): string[] {
  return [...new Set(lists.flat())];
}

/** `hooks`, once its store faults are known not to take a name of the nemesis's own. */
function checked(kind: string, hooks: NemesisHooks): NemesisHooks {
  for (const fault of Object.keys(hooks.storeFaults ?? {})) {
    if ((NEMESIS_FAULTS as readonly string[]).includes(fault) || fault.includes("/")) {
      throw new HarnessLoadError(
        kind,
        `its store fault '${fault}' takes a name the nemesis reserves`,
      );
    }
  }
  return hooks;
}
