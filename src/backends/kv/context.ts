/**
 * What the parts of a Deno KV session share: the store, the layout under the configured prefix,
 * the resolved settings and the backend's telemetry.
 *
 * @module
 */
import type { StoreTelemetry } from "../../telemetry/store.ts";
import type { KvLayout } from "./layout.ts";
import type { KvSettings, KvU64Class } from "./options.ts";

/** Everything a part of the session needs to reach the store. */
export interface KvContext {
  /** The backend's store. */
  readonly kv: Deno.Kv;
  /** The tuple-key layout under the configured prefix. */
  readonly layout: KvLayout;
  /** The counter class of `kv`'s implementation (`Deno.KvU64`, or `@deno/kv`'s on Node.js). */
  readonly KvU64: KvU64Class;
  /**
   * Whether watches wake on `kv.watch` as well as polling: only on Deno's own `Deno.Kv`. The
   * `@deno/kv` package's watch (Node.js) leaves a native read pending after it is cancelled,
   * which keeps the process alive and can block `kv.close()`.
   */
  readonly wakeByWatch: boolean;
  /** Checks one atomic operation may carry: `MAX_CHECKS`, or `NPM_KV_MAX_CHECKS` (`@deno/kv`). */
  readonly maxChecks: number;
  /** The backend's options, validated, with defaults (the node's name among them). */
  readonly settings: KvSettings;
  /** The backend's store telemetry (see `src/telemetry/store.ts`). */
  readonly telemetry?: StoreTelemetry;
}
