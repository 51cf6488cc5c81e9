/**
 * Each option (the allocator's, each backend's) is declared once, in its zod schema: the resolved settings are the schema's
 * output ({@linkcode SettingsOf}), and the documented public options interface (kept for its
 * JSDoc, which the schema cannot carry into `deno doc`) is checked at compile time to be exactly
 * what the schema accepts ({@linkcode SameShape}), so adding, dropping or retyping an option in
 * one place without the other does not compile.
 *
 * @example The check fails to compile as soon as the interface and the schema disagree
 * ```ts
 * import assert from "node:assert/strict";
 * import { z } from "zod";
 * import type { SameShape, SettingsOf } from "./option_shape.ts";
 *
 * const schema = z.object({ node: z.string(), ttlMs: z.number().default(1000) }).strict();
 * interface Options {
 *   readonly node: string;
 *   readonly ttlMs?: number;
 * }
 * const matches: SameShape<Options, z.input<typeof schema>> = true;
 * // @ts-expect-error `ttlMs` is optional in the schema, not in this interface.
 * const drifted: SameShape<{ node: string; ttlMs: number }, z.input<typeof schema>> = true;
 * const settings: SettingsOf<typeof schema> = schema.parse({ node: "n1" });
 * assert.deepEqual([matches, drifted, settings.ttlMs], [true, true, 1000]);
 * ```
 *
 * @module
 */
import type { z } from "./deps/zod.ts";

/**
 * `T` read-only all the way down (functions as they are): options are never changed after
 * validation, and a readonly view erases the mutability differences between a zod type and an
 * interface written with `readonly`.
 */
export type DeepReadonly<T> = T extends (...args: never[]) => unknown ? T
  : T extends readonly (infer E)[] ? readonly DeepReadonly<E>[]
  : T extends object ? { readonly [K in keyof T]: DeepReadonly<T[K]> }
  : T;

/** The settings an options schema resolves to: its output, read-only. */
export type SettingsOf<S extends z.ZodType> = DeepReadonly<z.output<S>>;

/** Whether `A` and `B` are the same type (not merely assignable one way). */
type Identical<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true
  : false;

/**
 * `true` exactly when `Options` (a documented interface) and `Input` (a schema's `z.input`) have
 * the same options, each required or optional alike and of the same type, read-only aside; `false`
 * otherwise, which a `const check: SameShape<…> = true` then refuses to compile.
 */
export type SameShape<Options, Input> = Identical<DeepReadonly<Options>, DeepReadonly<Input>>;
