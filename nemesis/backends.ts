/**
 * The backends the nemesis suite runs on: every backend in the registry, with the hooks of its
 * harness, loaded once when this module is. Nothing else in `nemesis/` lists backends.
 *
 * @module
 */
import { loadHarnesses, UnknownBackendError } from "../src/backends/testing.ts";
import type { NemesisHooks } from "./stores/store.ts";

/** One backend as the nemesis suite knows it. */
export interface NemesisBackend {
  /** Its kind (`--backend`). */
  readonly kind: string;
  /** Why it cannot run here, or `undefined` when it can. */
  unavailable(): string | undefined;
  /** What the suite does on it. */
  readonly hooks: NemesisHooks;
}

/** Every backend, in the registry's order. */
export const NEMESIS_BACKENDS: readonly NemesisBackend[] = (await loadHarnesses()).map((h) => ({
  kind: h.kind,
  unavailable: h.unavailable,
  hooks: h.nemesis,
}));

/** The kinds `--backend` takes, in the registry's order. */
export const BACKEND_KINDS: readonly string[] = NEMESIS_BACKENDS.map((b) => b.kind);

/** The nemesis hooks of backend `kind`; throws `UnknownBackendError` for a kind not registered. */
export function hooksOf(kind: string): NemesisHooks {
  const backend = NEMESIS_BACKENDS.find((b) => b.kind === kind);
  if (!backend) throw new UnknownBackendError(kind);
  return backend.hooks;
}
