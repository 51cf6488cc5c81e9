/**
 * A broken promise found by a nemesis check: which check, what happened, and the evidence (log
 * lines, store entries) a reader needs to reproduce the diagnosis.
 *
 * @module
 */

/** One violation. */
export interface Violation {
  /** The check's name, as the table prints it. */
  readonly check: string;
  /** One sentence. */
  readonly message: string;
  /** Records and store entries behind it. */
  readonly evidence?: unknown;
}

/** Milliseconds since the epoch as `HH:MM:SS.mmm` (UTC), for messages. */
export function clock(ms: number): string {
  return new Date(ms).toISOString().slice(11, 23);
}

/**
 * The first `limit` of `list`; how many were left out is added to `dropped` under the check's
 * name (one incident can produce thousands of violations of one kind).
 */
export function capViolations(
  list: Violation[],
  limit: number,
  dropped: Record<string, number>,
): Violation[] {
  if (list.length <= limit) return list;
  dropped[list[0].check] = (dropped[list[0].check] ?? 0) + list.length - limit;
  return list.slice(0, limit);
}

/** `text` cut to `max` characters, with the full length noted (keys can be 60,000 characters). */
export function short(text: string, max = 80): string {
  return text.length <= max ? text : `${text.slice(0, max)}…(${text.length} chars)`;
}
