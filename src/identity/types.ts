/**
 * Public types of the identity layer.
 *
 * @module
 */
import type { Labels } from "./labels.ts";

/** A security identity: a numeric ID and the label set it stands for. */
export interface Identity {
  /** The numeric identity (reserved, global, or node-local with its scope bits). */
  readonly id: number;
  /** The labels. */
  readonly labels: Labels;
}

/**
 * One batch of the change stream (Cilium's `UpdateIdentities(added, deleted)`): `added` and
 * `deleted` are disjoint; an identity added and then deleted within one batch appears only in
 * `deleted`.
 */
export interface IdentityChange {
  /** Identities that appeared or changed, with their labels. */
  readonly added: ReadonlyMap<number, Labels>;
  /** Identities that are gone. */
  readonly deleted: ReadonlySet<number>;
}
