/**
 * Validation of the CLI's options (zod, kept internal): durations, `--store`, `--prefix`, IDs and
 * the numeric knobs. `--store` picks a backend from `src/backends/registry.ts`, whose driver
 * validates its own options and describes the store. Every failure is an
 * {@linkcode InvalidOptionsError} naming the flag.
 *
 * @module
 */
import { z } from "../deps/zod.ts";
import { InvalidIdError, InvalidOptionsError } from "../errors.ts";
import type { BackendDriver } from "../backends/driver.ts";
import {
  attributeName,
  durationFlag,
  flagName,
  longFlag,
  validateFlags,
} from "../backends/driver_options.ts";
import { parseOptions } from "../validate.ts";
import {
  backendOfKind,
  backendOfStore,
  BACKENDS,
  type SelectedStore,
  storeSyntax,
} from "../backends/registry.ts";
import {
  type IdentityAllocationMode,
  isDoubleWrite,
  parseIdentityAllocationMode,
} from "../backends/doublewrite/mod.ts";

export { formatDuration } from "../backends/driver_options.ts";

const integer = (min: number) =>
  z.string().transform((s, ctx) => {
    const text = s.trim();
    if (!/^[+-]?\d+$/.test(text)) {
      ctx.addIssue({ code: "custom", message: `must be a whole number, got '${s}'` });
      return z.NEVER;
    }
    const n = Number(text);
    if (n < min) {
      ctx.addIssue({ code: "custom", message: `must be at least ${min}, got ${text}` });
      return z.NEVER;
    }
    if (!Number.isSafeInteger(n)) {
      ctx.addIssue({
        code: "custom",
        message: `must be at most ${Number.MAX_SAFE_INTEGER}, got ${text}`,
      });
      return z.NEVER;
    }
    return n;
  });

/** The backend of `--store` and the store as its driver describes it. */
export interface StoreChoice {
  /** The backend's driver. */
  readonly driver: BackendDriver;
  /** The store description (the driver's `description` schema holds). */
  readonly description: unknown;
}

/** Options every command understands, after validation. */
export interface GlobalOptions {
  /** `--store` as given: `kv:<file>`, `etcd://…` (checked against the drivers). */
  readonly store: string;
  /** The raw `--prefix`, or `undefined` for the backend's default. */
  readonly prefix?: string;
  readonly node: string;
  /** Whether `--node` was given (not the per-process default). */
  readonly nodeGiven: boolean;
  readonly timeoutMs: number;
  readonly leaseTtlMs: number;
  readonly min: number;
  readonly max: number;
  readonly json: boolean;
  readonly progress: boolean;
  readonly debug: boolean;
  readonly verbose: boolean;
  /** The store's backend and description, with the backend's own options applied. */
  readonly backend: StoreChoice;
  /** `--identity-allocation-mode`, when given. */
  readonly mode?: IdentityAllocationMode;
  /** The CRD side of a double-write mode (`--kubeconfig`); `backend` is then the kvstore side. */
  readonly crd?: StoreChoice;
}

const globalSchema = z.object({
  store: z.string().refine(
    (s) => backendOfStore(s) !== undefined,
    { error: () => `must be ${storeSyntax()}` },
  ),
  prefix: z.string().min(1, "must not be empty").optional(),
  node: z.string().min(1, "must not be empty").max(253, "must be at most 253 characters")
    .refine((s) => !s.includes("/"), "must not contain '/'"),
  timeout: durationFlag(1),
  leaseTtl: durationFlag(500),
  min: integer(1),
  max: integer(1),
  json: z.boolean().default(false),
  progress: z.boolean().default(false),
  debug: z.boolean().default(false),
  verbose: z.boolean().default(false),
  identityAllocationMode: z.string().optional(),
  kubeconfig: z.string().min(1, "must not be empty").optional(),
}).refine((o) => o.max > o.min, { message: "must be greater than --min", path: ["max"] });

/** What commander collected: option values by attribute name, and where each came from. */
export interface CollectedOptions {
  /** Values by attribute name (`leaseTtl`, `tlsServerName`). */
  readonly values: Readonly<Record<string, unknown>>;
  /** Where the value of an attribute came from: `cli`, `env`, `default`, or `undefined`. */
  readonly sourceOf: (attribute: string) => string | undefined;
  /** The environment variable of an attribute's option, if it has one. */
  readonly envOf?: (attribute: string) => string | undefined;
}

/** `a` or `an`, for a backend's title in a sentence. */
function article(title: string): string {
  return /^[aeiou]/i.test(title) ? "an" : "a";
}

/**
 * Refuses another backend's option given on the command line: it would be ignored, and the user
 * meant some store. The environment serves every store, so a value from it is not refused.
 */
function refuseForeignOptions(
  selected: SelectedStore,
  store: string,
  o: CollectedOptions,
  also?: BackendDriver,
): void {
  // A double-write mode's CRD side (`also`) takes its own options beside the store's.
  const own = new Set([...selected.driver.options, ...(also?.options ?? [])].map(attributeName));
  for (const other of BACKENDS) {
    if (other === selected.driver || other === also) continue;
    for (const option of other.options) {
      const attribute = attributeName(option);
      if (own.has(attribute) || o.sourceOf(attribute) !== "cli") continue;
      const flag = longFlag(option);
      const title = selected.driver.title;
      // A flag several backends share names them all.
      const owners = BACKENDS.filter((d) => d.options.some((x) => longFlag(x) === flag));
      throw new InvalidOptionsError(
        `invalid option: ${flag} is for ${owners.map((d) => d.title).join(" or ")}; ` +
          `--store ${store} is ${article(title)} ${title} store: drop ${flag}, or give --store ` +
          owners.map((d) => d.syntax).join(" or "),
      );
    }
  }
}

/**
 * The values of `driver`'s own options that commander collected (given, from env or default),
 * less a value from the environment whose option's `envOnlyWith` flag has no value.
 */
function valuesOf(driver: BackendDriver, o: CollectedOptions): Record<string, unknown> {
  const values: Record<string, unknown> = {};
  for (const option of driver.options) {
    const attribute = attributeName(option);
    if (o.values[attribute] === undefined) continue;
    const needs = option.envOnlyWith;
    if (
      needs !== undefined && o.sourceOf(attribute) === "env" &&
      o.values[attributeName({ flags: needs, description: "" })] === undefined
    ) continue;
    values[attribute] = o.values[attribute];
  }
  return values;
}

/**
 * Names a flag in messages: `--store`, or `IDALLOC_STORE (--store from the environment)` when its
 * value came from there, so that a bad exported value is found where it was set.
 */
function sourcedFlagName(o: CollectedOptions): (path: readonly PropertyKey[]) => string {
  return (path) => {
    const flag = flagName(path);
    const attribute = String(path[0] ?? "");
    const env = o.envOf?.(attribute);
    return env !== undefined && o.sourceOf(attribute) === "env"
      ? `${env} (${flag} from the environment)`
      : flag;
  };
}

/**
 * Validates the options commander collected (strings and booleans): the common ones, then the
 * store's through its backend's driver.
 */
export function globalOptions(collected: CollectedOptions, nodeGiven: boolean): GlobalOptions {
  const o = parseOptions(globalSchema, collected.values, "option", sourcedFlagName(collected));
  const selected = backendOfStore(o.store)!;
  const mode = o.identityAllocationMode === undefined
    ? undefined
    : modeOf(o.identityAllocationMode, selected, o.kubeconfig !== undefined);
  const crdDriver = mode !== undefined && isDoubleWrite(mode) ? backendOfKind("k8s")! : undefined;
  refuseForeignOptions(selected, o.store, collected, crdDriver);
  const description = selected.driver.describe(
    selected.rest,
    valuesOf(selected.driver, collected),
    {
      prefix: o.prefix,
      timeoutMs: o.timeout,
      leaseTtlMs: o.leaseTtl,
    },
  );
  return {
    store: o.store,
    prefix: o.prefix,
    node: o.node,
    nodeGiven,
    timeoutMs: o.timeout,
    leaseTtlMs: o.leaseTtl,
    min: o.min,
    max: o.max,
    json: o.json,
    progress: o.progress,
    debug: o.debug,
    verbose: o.verbose,
    backend: { driver: selected.driver, description },
    ...(mode === undefined ? {} : { mode }),
    ...(crdDriver === undefined ? {} : {
      crd: {
        driver: crdDriver,
        description: crdDriver.describe(o.kubeconfig!, valuesOf(crdDriver, collected), {
          timeoutMs: o.timeout,
          leaseTtlMs: o.leaseTtl,
        }),
      },
    }),
  };
}

/**
 * Checks `--identity-allocation-mode` against the store: `kvstore` needs an etcd store, `crd` a
 * Kubernetes one, a double-write mode an etcd store and `--kubeconfig` (its CRD side).
 */
function modeOf(
  text: string,
  selected: SelectedStore,
  kubeconfig: boolean,
): IdentityAllocationMode {
  let mode: IdentityAllocationMode;
  try {
    mode = parseIdentityAllocationMode(text);
  } catch (err) {
    throw new InvalidOptionsError(
      `invalid option: --identity-allocation-mode ${text}: must be ` +
        "kvstore, crd, doublewrite-readkvstore or doublewrite-readcrd",
      { cause: err },
    );
  }
  const kind = selected.driver.kind;
  const needs = mode === "crd" ? "k8s" : "etcd";
  if (kind !== needs) {
    throw new InvalidOptionsError(
      `invalid option: --identity-allocation-mode ${mode} needs ` +
        (needs === "k8s" ? "--store k8s:…" : "--store etcd://…") + `, not a ${kind} store`,
    );
  }
  if (isDoubleWrite(mode) !== kubeconfig) {
    throw new InvalidOptionsError(
      isDoubleWrite(mode)
        ? `invalid option: --identity-allocation-mode ${mode} needs --kubeconfig FILE (its CRD side)`
        : `invalid option: --kubeconfig is for the double-write modes, not ${mode}`,
    );
  }
  return mode;
}

/** Validates one duration flag of a command (`--every`, `--grace`). */
export function durationOption(flag: string, text: string, min = 0): number {
  return validateFlags(z.object({ [flag]: durationFlag(min) }), { [flag]: text })[flag] as number;
}

/** Validates one whole-number flag of a command (`--cluster-id`). */
export function integerOption(flag: string, text: string, min = 0): number {
  return validateFlags(z.object({ [flag]: integer(min) }), { [flag]: text })[flag] as number;
}

/** An ID argument: a positive safe integer, else {@linkcode InvalidIdError}. */
export function parseIdArgument(text: string): number {
  const trimmed = text.trim();
  if (!/^\d+$/.test(trimmed)) {
    throw new InvalidIdError(`ID '${text}' is not a positive whole number`);
  }
  const id = Number(trimmed);
  if (id === 0) throw new InvalidIdError("ID 0 is not a positive whole number");
  if (!Number.isSafeInteger(id)) {
    throw new InvalidIdError(
      `ID ${trimmed} is too large: IDs go up to ${Number.MAX_SAFE_INTEGER}`,
    );
  }
  return id;
}
