/**
 * The record a store keeps of its own changes during a nemesis run beside Cilium nodes: every
 * change of a master, a reference or a Cilium mutex, in the store's order (its revision), with the
 * instant the recorder saw it. A backend's run store produces it
 * (`NemesisRunStore.recordChanges` in `nemesis.ts`); the nemesis writes it as JSON lines and reads it
 * back (`nemesis/checks/store_history.ts`) to attribute violations.
 *
 * @module
 */
import { z } from "../deps/zod.ts";

/** One change of a master (`key: null`: deleted) or a reference (`id: null`: deleted). */
export const storeChangeSchema = z.discriminatedUnion("t", [
  z.object({
    t: z.literal("master"),
    /** The store's revision of the change. */
    rev: z.number().int(),
    /** When the recorder saw it (ms since the epoch). */
    at: z.number(),
    id: z.number().int(),
    key: z.string().nullable(),
    /**
     * Kubernetes: the identity's `creationTimestamp` (ms, whole seconds), which orders a key's
     * identities for Cilium's CRD-mode lookup and idalloc's (the oldest, ties to the lowest ID).
     * It is the API server's clock when the create was admitted, so it can precede the commit
     * (`rev`) by seconds while etcd is down, and two creates may commit in the other order.
     */
    created: z.number().optional(),
    /**
     * The earliest instant it can have happened, when that is before the previous change its
     * watch delivered: set on what a re-list after a gap brings (the instant its watch was last
     * current), which arrives late by however long the watch was blind.
     */
    early: z.number().optional(),
  }),
  z.object({
    t: z.literal("ref"),
    rev: z.number().int(),
    at: z.number(),
    key: z.string(),
    node: z.string(),
    /** The ID it names; `null` when deleted (or, for a value that is no ID, garbage: skipped). */
    id: z.number().int().nullable(),
    /** Its lease (`"0"`: none). */
    lease: z.string().optional(),
    /**
     * The earliest instant it can have happened, when that is before the previous change its
     * watch delivered: set on what a re-list after a gap brings (the instant its watch was last
     * current), which arrives late by however long the watch was blind.
     */
    early: z.number().optional(),
  }),
  /** A Cilium mutex key was written (`held`) or deleted: `of` is the key, or `id/<N>` for GC's. */
  z.object({
    t: z.literal("lock"),
    rev: z.number().int(),
    at: z.number(),
    of: z.string(),
    /** The holder's lock lease, as the mutex key's last segment (hex). */
    lease: z.string(),
    held: z.boolean(),
  }),
  /**
   * A node Lease changed (Kubernetes): its epoch and expiry as written (`null`: deleted). What
   * judges, at an identity's deletion, whether a reference on it was live.
   */
  z.object({
    t: z.literal("lease"),
    rev: z.number().int(),
    at: z.number(),
    node: z.string(),
    epoch: z.string().nullable(),
    /** `renewTime + leaseDurationSeconds` (the holder's clock), ms; `null`: none. */
    expiresAt: z.number().nullable(),
    /**
     * The earliest instant it can have happened, when that is before the previous change its
     * watch delivered: set on what a re-list after a gap brings (the instant its watch was last
     * current), which arrives late by however long the watch was blind.
     */
    early: z.number().optional(),
  }),
  /**
   * A master was deleted (Kubernetes: an identity object), with what it carried at its last
   * state: its idalloc references (`node → epoch`) and whether Cilium's GC mark was on it.
   * `inferred`: seen gone on a re-list after a gap, not from its own event.
   */
  z.object({
    t: z.literal("deleted"),
    rev: z.number().int(),
    at: z.number(),
    id: z.number().int(),
    key: z.string(),
    refs: z.record(z.string(), z.string()),
    marked: z.boolean(),
    inferred: z.boolean().optional(),
    /**
     * The earliest instant it can have happened, when that is before the previous change its
     * watch delivered: set on what a re-list after a gap brings (the instant its watch was last
     * current), which arrives late by however long the watch was blind.
     */
    early: z.number().optional(),
  }),
  /**
   * The recorder lost events (a compaction under its watch, a watch that failed): spans around it
   * may be wrong. `since`: the instant the failed watch was last current; a record whose gaps say
   * it marks what the re-list that follows brings with `early` (Kubernetes). Without it (etcd,
   * older records) what arrives shortly after a gap may have happened as early as the record's
   * last change before it (`StoreHistory`).
   */
  z.object({ t: z.literal("gap"), at: z.number(), why: z.string(), since: z.number().optional() }),
]);

/** One recorded change. */
export type StoreChange = z.infer<typeof storeChangeSchema>;
