/**
 * How a nemesis process reaches a double-write store (the mode it opens and each side's own
 * spec, which that side's harness checks), and the migration step a run makes, by its seed.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { migrationOf } from "./nemesis_spec.ts";
 * assert.deepEqual(migrationOf(42), {
 *   from: "doublewrite-readkvstore",
 *   to: "doublewrite-readcrd",
 * });
 * assert.equal(migrationOf(7).to, "doublewrite-readkvstore");
 * ```
 *
 * @module
 */
import { z } from "../../../deps/zod.ts";
import type { NemesisStoreSpec } from "../../../testing/nemesis.ts";
import type { DoubleWriteMode } from "../mode.ts";

/** The nemesis's name of the double-write store (`--backend doublewrite`): no `--store` scheme. */
export const DOUBLEWRITE_KIND = "doublewrite";

/** A side's spec, which that side's harness checks when it opens it. */
const sideSpecSchema = z.looseObject({ kind: z.string().min(1) });

const specSchema = z.object({
  kind: z.literal(DOUBLEWRITE_KIND),
  /** The mode this process opens. */
  mode: z.enum(["doublewrite-readkvstore", "doublewrite-readcrd"]),
  /** The kvstore side: the etcd harness's spec. */
  kvstore: sideSpecSchema,
  /** The CRD side: the Kubernetes harness's spec. */
  crd: sideSpecSchema,
});

/** How a nemesis process reaches a double-write store. */
export type DoubleWriteNemesisSpec = z.infer<typeof specSchema>;

/** `spec` as a double-write store's; throws a `ZodError` when it is another's or malformed. */
export function doubleWriteSpec(spec: NemesisStoreSpec): DoubleWriteNemesisSpec {
  return specSchema.parse(spec);
}

/** A migration step: the mode the nodes leave, and the one they come back in. */
export interface MigrationStep {
  readonly from: DoubleWriteMode;
  readonly to: DoubleWriteMode;
}

/**
 * The step a run with `seed` makes: toward the CRDs (`doublewrite-readkvstore` →
 * `doublewrite-readcrd`) with an even seed, back toward the kvstore with an odd one, so that
 * consecutive seeds cover both directions.
 */
export function migrationOf(seed: number | undefined): MigrationStep {
  return (seed ?? 0) % 2 === 0
    ? { from: "doublewrite-readkvstore", to: "doublewrite-readcrd" }
    : { from: "doublewrite-readcrd", to: "doublewrite-readkvstore" };
}
