/**
 * What the parts of a Deno KV session share: the store, the layout under the configured prefix,
 * the resolved settings and the backend's telemetry.
 *
 * @module
 */
import type { StoreTelemetry } from "../../telemetry/store.ts";
import type { KvLayout } from "./layout.ts";
import type { KvSettings } from "./options.ts";

/** Everything a part of the session needs to reach the store. */
export interface KvContext {
  /** The backend's store. */
  readonly kv: Deno.Kv;
  /** The tuple-key layout under the configured prefix. */
  readonly layout: KvLayout;
  /** The backend's options, validated, with defaults (the node's name among them). */
  readonly settings: KvSettings;
  /** The backend's store telemetry (see `src/telemetry/store.ts`). */
  readonly telemetry?: StoreTelemetry;
}
