/**
 * The stores the nemesis runs beside the backend registry's: stores composed of the registry's
 * backends, which no `--store` scheme names (the double-write store: Cilium's kvstore on etcd and
 * its CRDs on Kubernetes, written together). Each has a harness of its own
 * (`ComposedHarness`), loaded only when asked for, so that a child process loads only the harness
 * of the store it opens; and {@linkcode loadNemesisHooks} finds any store's hooks, the registry's
 * or these.
 *
 * @module
 */
import type { ComposedHarness } from "../src/testing/harness_contract.ts";
import { loadHarness } from "../src/testing/harness.ts";
import type { NemesisHooks } from "../src/testing/nemesis.ts";

/** Each composed store's kind, and how its harness module is loaded. */
const COMPOSED: Readonly<Record<string, () => Promise<{ harness: ComposedHarness }>>> = {
  doublewrite: () => import("../src/backends/doublewrite/testing/harness.ts"),
};

/** The kinds of the composed stores (`--backend doublewrite`), never part of `--backend all`. */
export const COMPOSED_KINDS: readonly string[] = Object.keys(COMPOSED);

const loaded = new Map<string, Promise<ComposedHarness>>();

/** The harness of composed store `kind`, loaded once per process; `undefined` for another kind. */
export function loadComposed(kind: string): Promise<ComposedHarness> | undefined {
  if (!Object.hasOwn(COMPOSED, kind)) return undefined;
  let harness = loaded.get(kind);
  if (harness === undefined) {
    harness = COMPOSED[kind]().then((m) => m.harness);
    loaded.set(kind, harness);
  }
  return harness;
}

/** The nemesis hooks of store `kind`: a composed store's, else the registry backend's. */
export async function loadNemesisHooks(kind: string): Promise<NemesisHooks> {
  return (await (loadComposed(kind) ?? loadHarness(kind))).nemesis;
}
