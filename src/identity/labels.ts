/**
 * Security labels (`source:key=value`) and label sets, parsed and printed byte-for-byte as Cilium
 * does (`pkg/labels`), plus the kvstore key format of a label set (`source:key=value;` per label,
 * sorted by key) and the allocator {@linkcode KeyCodec} built on it.
 *
 * @example Parse, print and round-trip through the kvstore format
 * ```ts
 * import assert from "node:assert/strict";
 * import { Labels } from "@idalloc/idalloc/identity";
 *
 * const labels = Labels.parse(["k8s:app=web", "k8s:io.kubernetes.pod.namespace=prod"]);
 * const stored = labels.toKvstoreString();
 * assert.equal(stored, "k8s:app=web;k8s:io.kubernetes.pod.namespace=prod;");
 * assert.ok(Labels.fromKvstoreString(stored).equals(labels));
 * ```
 *
 * @module
 */
import type { KeyCodec } from "../allocator/types.ts";
import { LabelError } from "./errors.ts";

/** Well-known label sources (Cilium's `LabelSource*` constants). Any other string is allowed too. */
export const LabelSource = {
  /** No source given (`foo=bar` parses as `unspec:foo=bar`). */
  Unspec: "unspec",
  /** Matches any source when used in {@linkcode Labels.has}. */
  Any: "any",
  /** Imported from Kubernetes. */
  K8s: "k8s",
  /** Imported from the container runtime. */
  Container: "container",
  /** Imported from the CNI plugin. */
  CNI: "cni",
  /** Cilium's own reserved labels (`reserved:host`, `reserved:world`, …). */
  Reserved: "reserved",
  /** Generated for CIDRs (`cidr:10.0.0.0/8`). */
  CIDR: "cidr",
  /** Labels of CIDR groups. */
  CIDRGroup: "cidrgroup",
  /** IPs resolved by FQDN lookups. */
  FQDN: "fqdn",
  /** Labels of remote nodes. */
  Node: "node",
  /** Policies read from files. */
  Directory: "directory",
} as const;

/** The key of the label that pins a user-reserved identity (`io.cilium.fixed-identity=<name>`). */
export const FIXED_IDENTITY_LABEL_KEY = "io.cilium.fixed-identity";

/** The k8s label carrying the cluster name (`k8s:io.cilium.k8s.policy.cluster=<name>`). */
export const CLUSTER_LABEL_KEY = "io.cilium.k8s.policy.cluster";

/**
 * Compares two strings in UTF-8 byte order (Go's `sort.Strings`), which differs from JavaScript's
 * UTF-16 order only for characters above U+FFFF against U+E000–U+FFFF.
 */
export function compareUtf8(a: string, b: string): number {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i);
    const y = b.charCodeAt(i);
    if (x !== y) return utf8Rank(x) - utf8Rank(y);
  }
  return a.length - b.length;
}

// Surrogates (code points above U+FFFF) must sort after U+E000–U+FFFF, as their UTF-8 bytes do.
function utf8Rank(unit: number): number {
  if (unit >= 0xd800 && unit <= 0xdfff) return unit + 0x2000;
  if (unit >= 0xe000) return unit - 0x800;
  return unit;
}

/** The three parts of a label string, split exactly as Cilium's `ParseLabel`, unvalidated. */
export interface LabelParts {
  /** The source. */
  readonly source: string;
  /** The key. */
  readonly key: string;
  /** The value (empty when absent). */
  readonly value: string;
}

/**
 * Cilium's `parseSource(str, ':')`: the raw source (empty when there is none) and the rest. A
 * leading `$` means `reserved`; otherwise the source ends at the first `:`; without any `:`, a
 * `reserved.` prefix means `reserved`.
 */
function splitSource(str: string): { source: string; next: string } {
  if (str.length === 0) return { source: "", next: "" };
  if (str[0] === "$") return { source: LabelSource.Reserved, next: str.slice(1) };
  const colon = str.indexOf(":");
  if (colon >= 0) return { source: str.slice(0, colon), next: str.slice(colon + 1) };
  if (str.startsWith("reserved.")) {
    return { source: LabelSource.Reserved, next: str.slice("reserved.".length) };
  }
  return { source: "", next: str };
}

/**
 * Splits `str` as Cilium's `ParseLabel` does, without validating: the source as in `parseSource`
 * (`unspec` when there is none); key and value split at the first `=`, except that a `=` right
 * after a `reserved` source starts the key (`$=host` is `reserved:host`).
 */
export function splitLabel(str: string): LabelParts {
  const { source, next } = splitSource(str);
  const parsedSource = source === "" ? LabelSource.Unspec : source;
  const eq = next.indexOf("=");
  if (eq < 0) return { source: parsedSource, key: next, value: "" };
  if (eq === 0 && source === LabelSource.Reserved) {
    return { source: parsedSource, key: next.slice(1), value: "" };
  }
  return { source: parsedSource, key: next.slice(0, eq), value: next.slice(eq + 1) };
}

/**
 * One label. Immutable. Only labels that survive both string forms unchanged can be built: the
 * source is non-empty and has no `:`, `;` or `=` and does not start with `$`; the key is non-empty
 * and has no `=` or `;`; the value has no `;`. Anything else throws {@linkcode LabelError}.
 */
export class Label {
  /** Where the label comes from (`k8s`, `reserved`, `cidr`, …). */
  readonly source: string;
  /** The key; unique within a {@linkcode Labels} set. */
  readonly key: string;
  /** The value; may be empty. */
  readonly value: string;

  /**
   * Builds a label; throws {@linkcode LabelError} if it could not be stored unchanged.
   *
   * @param source the source, e.g. `k8s`
   * @param key the key, e.g. `app`
   * @param value the value; empty by default
   */
  constructor(source: string, key: string, value = "") {
    checkLabel(source, key, value);
    this.source = source;
    this.key = key;
    this.value = value;
  }

  /**
   * Parses `source:key=value` (or `source:key`, `key=value`, `$name`) as Cilium's `ParseLabel`.
   * Throws {@linkcode LabelError} if the result cannot be stored (see {@linkcode Label}).
   */
  static parse(str: string): Label {
    const { source, key, value } = splitLabel(str);
    return new Label(source, key, value);
  }

  /** Cilium's `Label.String()`: `source:key=value`, or `source:key` when the value is empty. */
  toString(): string {
    return this.value.length !== 0
      ? `${this.source}:${this.key}=${this.value}`
      : `${this.source}:${this.key}`;
  }

  /** Cilium's `FormatForKVStore()`: `source:key=value;`, always with `=` and the final `;`. */
  toKvstoreString(): string {
    return `${this.source}:${this.key}=${this.value};`;
  }

  /**
   * Cilium's `Label.Equals`: same key and value, and the same source unless this label's source
   * is `any`.
   */
  matches(other: Label): boolean {
    if (this.source !== LabelSource.Any && this.source !== other.source) return false;
    return this.key === other.key && this.value === other.value;
  }

  /** Exact equality of source, key and value. */
  equals(other: Label): boolean {
    return this.source === other.source && this.key === other.key && this.value === other.value;
  }
}

function checkLabel(source: string, key: string, value: string): void {
  const where = () => JSON.stringify(`${source}:${key}=${value}`);
  if (typeof source !== "string" || typeof key !== "string" || typeof value !== "string") {
    throw new LabelError("label source, key and value must be strings");
  }
  if (source.length === 0) throw new LabelError(`label ${where()} has an empty source`);
  if (/[:;=]/.test(source) || source[0] === "$") {
    throw new LabelError(
      `label source ${JSON.stringify(source)} must not contain ':', ';' or '=' nor start with '$'`,
    );
  }
  if (key.length === 0) throw new LabelError(`label ${where()} has an empty key`);
  if (key.includes("=") || key.includes(";")) {
    throw new LabelError(`label key ${JSON.stringify(key)} must not contain '=' or ';'`);
  }
  if (value.includes(";")) {
    throw new LabelError(
      `label value ${
        JSON.stringify(value)
      } must not contain ';' (it separates labels in the store)`,
    );
  }
}

let fromCheckedString: (str: string, size: number) => Labels;

/**
 * An immutable set of labels with unique keys (a later label with the same key replaces an earlier
 * one, as in Cilium's `Labels` map), iterated in key order.
 */
export class Labels implements Iterable<Label> {
  /**
   * Sorted by key (UTF-8 order), keys unique. Sets decoded from the store start without it and
   * parse their canonical string on first use: a watch-fed cache of thousands of identities then
   * holds one string per identity instead of a tree of label objects.
   */
  #parsed: readonly Label[] | undefined;
  #kvstore: string | undefined;
  readonly #size: number;

  private constructor(sorted: readonly Label[] | undefined, kvstore?: string, size?: number) {
    this.#parsed = sorted;
    this.#kvstore = kvstore;
    this.#size = sorted?.length ?? size ?? 0;
  }

  get #labels(): readonly Label[] {
    return this.#parsed ??= parseCanonical(this.#kvstore ?? "");
  }

  static {
    // Module-private: only the codec may build a set from a string it has checked.
    fromCheckedString = (str, size) => new Labels(undefined, str, size);
  }

  /** The empty set. */
  static readonly empty: Labels = new Labels([]);

  /** A set of the given labels; for duplicate keys the last one wins. */
  static from(labels: Iterable<Label>): Labels {
    const byKey = new Map<string, Label>();
    for (const label of labels) {
      if (!(label instanceof Label)) throw new LabelError("Labels.from expects Label objects");
      byKey.set(label.key, label);
    }
    return new Labels([...byKey.values()].sort((a, b) => compareUtf8(a.key, b.key)));
  }

  /** The same as {@linkcode Labels.from} with the labels as arguments. */
  static of(...labels: Label[]): Labels {
    return Labels.from(labels);
  }

  /**
   * Cilium's `NewLabelsFromModel`: parses each string with {@linkcode Label.parse}. A single
   * string is one label. Throws {@linkcode LabelError} for a label that cannot be stored, one
   * with an empty key (`k8s:=x`, `=x`, `k8s:`, `""`), and two labels of one key that differ
   * (`k8s:a=b` and `k8s:a=c`). Cilium skips a label with an empty key and keeps the last value of
   * a key, silently: either turns a typo into another identity. The same label given twice counts
   * once. This is the
   * one parser of label strings a user gives (the library, the CLI's `identity` commands and the
   * Deploy service all parse with it), so every one of them gives the same verdict.
   */
  static parse(labels: string | Iterable<string>): Labels {
    return parseLabels(typeof labels === "string" ? [labels] : labels, "refuse");
  }

  /**
   * Cilium's `NewLabelArrayFromSortedList` turned into a set: splits on `;`, parses each part,
   * skips parts with an empty key (as Cilium does with stored strings: the last `;` leaves one).
   * Accepts any order; see {@linkcode labelsCodec} for the strict form the store holds.
   */
  static fromKvstoreString(str: string): Labels {
    return parseLabels(str.split(";"), "skip");
  }

  /**
   * Cilium's `Map2Labels(m, "")` (`PutKeyFromMap`): keys are `source:key` (a missing source means
   * `unspec`), values the label values. Inverse of {@linkcode Labels.toMap}.
   */
  static fromMap(map: Readonly<Record<string, string>>): Labels {
    const out: Label[] = [];
    for (const [k, v] of Object.entries(map)) {
      // `NewLabel` splits off the source only; a `=` stays part of the key.
      const { source, next } = splitSource(k);
      const src = source === "" ? LabelSource.Unspec : source;
      if (source === LabelSource.Reserved && next === "") out.push(new Label(src, v, ""));
      else out.push(new Label(src, next, v));
    }
    return Labels.from(out);
  }

  /** Number of labels. */
  get size(): number {
    return this.#size;
  }

  /** The label with key `key`. */
  get(key: string): Label | undefined {
    for (const label of this.#labels) if (label.key === key) return label;
    return undefined;
  }

  /** Cilium's `Labels.Has`: some label {@linkcode Label.matches} `label` (source `any` matches all). */
  has(label: Label): boolean {
    for (const own of this.#labels) if (label.matches(own)) return true;
    return false;
  }

  /** Whether some label has source `source`. */
  hasSource(source: string): boolean {
    for (const label of this.#labels) if (label.source === source) return true;
    return false;
  }

  /** A new set with `labels` added (replacing labels with the same key). */
  with(...labels: Label[]): Labels {
    return Labels.from([...this.#labels, ...labels]);
  }

  /** The labels in key order. */
  [Symbol.iterator](): IterableIterator<Label> {
    return this.#labels[Symbol.iterator]();
  }

  /** The labels in key order, as a new array. */
  toArray(): Label[] {
    return [...this.#labels];
  }

  /**
   * The kvstore key of this set (Cilium's `GlobalIdentity.GetKey()` / `SortedList()`): every
   * label as `source:key=value;`, sorted by key. Empty for the empty set.
   */
  toKvstoreString(): string {
    return this.#kvstore ??= this.#labels.map((l) => l.toKvstoreString()).join("");
  }

  /** Cilium's `StringMap()` (`GetAsMap`): `"source:key"` → value. */
  toMap(): Record<string, string> {
    const out: Record<string, string> = {};
    for (const l of this.#labels) out[`${l.source}:${l.key}`] = l.value;
    return out;
  }

  /** The labels' {@linkcode Label.toString} forms, sorted, joined with `,`. */
  toString(): string {
    return this.toJSON().join(",");
  }

  /** The labels' {@linkcode Label.toString} forms, sorted (Cilium's printable model). */
  toJSON(): string[] {
    return this.#labels.map((l) => l.toString()).sort(compareUtf8);
  }

  /**
   * How `console.log` and `Deno.inspect` show the set, `Labels(2) [ "k8s:a=b", "k8s:c=d" ]`: its
   * labels live in private fields, which inspection does not show (`Labels {}` otherwise).
   *
   * @param inspect Deno's `inspect`, to format the labels with the caller's options
   * @param options the caller's inspect options
   */
  [Symbol.for("Deno.customInspect")](
    inspect: (value: unknown, options?: unknown) => string,
    options?: unknown,
  ): string {
    return `Labels(${this.size}) ${inspect(this.toJSON(), options)}`;
  }

  /**
   * The same for Node's `util.inspect` (and so `console.log` under Node).
   *
   * @param _depth the remaining depth (the labels are one level)
   * @param options the caller's inspect options
   * @param inspect Node's `inspect`
   */
  [Symbol.for("nodejs.util.inspect.custom")](
    _depth: number,
    options: unknown,
    inspect: (value: unknown, options?: unknown) => string,
  ): string {
    return `Labels(${this.size}) ${inspect(this.toJSON(), options)}`;
  }

  /** Whether both sets hold exactly the same labels. */
  equals(other: Labels): boolean {
    if (this === other) return true;
    if (this.#size !== other.#size) return false;
    return this.toKvstoreString() === other.toKvstoreString();
  }
}

/** {@linkcode Labels.parse}, with empty keys skipped (stored strings) or refused (input). */
function parseLabels(labels: Iterable<string>, emptyKeys: "skip" | "refuse"): Labels {
  const byKey = new Map<string, Label>();
  for (const str of labels) {
    if (typeof str !== "string") throw new LabelError("Labels.parse expects strings");
    const parts = splitLabel(str);
    if (parts.key === "") {
      if (emptyKeys === "skip") continue;
      throw new LabelError(
        `label ${JSON.stringify(str)} has an empty key: write [source:]key[=value], ` +
          "e.g. k8s:app=web",
      );
    }
    const label = new Label(parts.source, parts.key, parts.value);
    const earlier = byKey.get(label.key);
    if (earlier !== undefined && earlier.toString() !== label.toString()) {
      throw new LabelError(
        `labels ${earlier} and ${label} have the same key '${label.key}': a label set holds ` +
          "one value per key",
      );
    }
    byKey.set(label.key, label);
  }
  return Labels.from(byKey.values());
}

/**
 * The number of labels in `str` if it is a canonical kvstore string (every label valid and ending
 * in `;`, keys strictly ascending in UTF-8 order, so also unique); throws {@linkcode LabelError}
 * otherwise. Equivalent to `Labels.fromKvstoreString(str).toKvstoreString() === str`, without
 * building label objects.
 */
function canonicalSize(str: string): number {
  if (str === "") return 0;
  if (!str.endsWith(";")) {
    throw new LabelError(`identity key does not end in ';': ${JSON.stringify(str)}`);
  }
  let count = 0;
  let previous: string | undefined;
  let start = 0;
  while (start < str.length) {
    const end = str.indexOf(";", start);
    const part = str.slice(start, end);
    const { source, key, value } = splitLabel(part);
    checkLabel(source, key, value);
    if (`${source}:${key}=${value}` !== part) {
      throw new LabelError(`not a canonical identity label: ${JSON.stringify(part)}`);
    }
    if (previous !== undefined && compareUtf8(previous, key) >= 0) {
      throw new LabelError(`identity key is not sorted by unique keys: ${JSON.stringify(str)}`);
    }
    previous = key;
    count++;
    start = end + 1;
  }
  return count;
}

/** Parses a string that `canonicalSize` accepted. */
function parseCanonical(str: string): Label[] {
  const out: Label[] = [];
  let start = 0;
  while (start < str.length) {
    const end = str.indexOf(";", start);
    const { source, key, value } = splitLabel(str.slice(start, end));
    out.push(new Label(source, key, value));
    start = end + 1;
  }
  return out;
}

/**
 * The allocator key codec of label sets. `encode` is the kvstore string; `decode` accepts only the
 * canonical form (sorted by key, unique keys, every label ending in `;`), so that every key read
 * from the store maps back to exactly the string it came from. A non-canonical key throws
 * {@linkcode LabelError} and the allocator skips it as corrupt. Decoded sets parse their labels
 * lazily.
 */
export const labelsCodec: KeyCodec<Labels> = {
  encode: (labels: Labels): string => labels.toKvstoreString(),
  decode: (encoded: string): Labels => fromCheckedString(encoded, canonicalSize(encoded)),
};
