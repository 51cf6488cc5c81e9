/**
 * Cilium's `identity-allocation-mode` values, and which store each one reads: the two single
 * stores (`kvstore`: etcd; `crd`: Kubernetes) and the two double-write modes of Cilium v1.17,
 * which write both and read the side their name says.
 *
 * @example
 * ```ts
 * import assert from "node:assert/strict";
 * import { parseIdentityAllocationMode, readSideOf } from "./mode.ts";
 * assert.equal(readSideOf(parseIdentityAllocationMode("doublewrite-readcrd")), "crd");
 * assert.equal(readSideOf("kvstore"), "kvstore");
 * ```
 *
 * @module
 */
import { z } from "../../deps/zod.ts";
import { InvalidOptionsError } from "../../errors.ts";

/** Every mode, in the order of a migration from the kvstore to CRDs. */
export const IDENTITY_ALLOCATION_MODES = [
  "kvstore",
  "doublewrite-readkvstore",
  "doublewrite-readcrd",
  "crd",
] as const;

/** One of Cilium's `identity-allocation-mode` values. */
export type IdentityAllocationMode = typeof IDENTITY_ALLOCATION_MODES[number];

/** The two modes that write both stores. */
export type DoubleWriteMode = "doublewrite-readkvstore" | "doublewrite-readcrd";

/** A side of a double-write store: the kvstore (etcd) or the CRDs (Kubernetes). */
export type Side = "kvstore" | "crd";

const modeSchema = z.enum(IDENTITY_ALLOCATION_MODES);

/** Checks a mode as typed (zod at the boundary); throws `InvalidOptionsError` naming the values. */
export function parseIdentityAllocationMode(text: string): IdentityAllocationMode {
  const parsed = modeSchema.safeParse(text);
  if (parsed.success) return parsed.data;
  throw new InvalidOptionsError(
    `identity allocation mode must be ${IDENTITY_ALLOCATION_MODES.join(", ")}; got '${text}'`,
  );
}

/** Whether `mode` writes both stores. */
export function isDoubleWrite(mode: IdentityAllocationMode): mode is DoubleWriteMode {
  return mode === "doublewrite-readkvstore" || mode === "doublewrite-readcrd";
}

/** The store `mode` reads (and, in the double-write modes, the one whose answer is the key's ID). */
export function readSideOf(mode: IdentityAllocationMode): Side {
  return mode === "kvstore" || mode === "doublewrite-readkvstore" ? "kvstore" : "crd";
}
