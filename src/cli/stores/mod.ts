/**
 * The backends the CLI can open, by `--store` scheme. The etcd driver loads the etcd client only
 * when `--store etcd://…` is used, so Deno KV commands do not pay for it.
 *
 * @module
 */
import type { StoreDriver } from "./driver.ts";
import { etcdDriver } from "./etcd.ts";
import { kvDriver } from "./kv.ts";

export type { DriverOpenOptions, OpenedBackend, StoreDriver } from "./driver.ts";

/** Every driver; a new backend adds its own here. */
export const DRIVERS: readonly StoreDriver[] = [kvDriver, etcdDriver];

/** The driver and the rest of `--store`, or `undefined` when no driver accepts it. */
export function driverOf(store: string): { driver: StoreDriver; rest: string } | undefined {
  for (const driver of DRIVERS) {
    if (!store.startsWith(driver.scheme)) continue;
    const rest = store.slice(driver.scheme.length);
    return driver.valid(rest) ? { driver, rest } : undefined;
  }
  return undefined;
}

/** How `--store` may be written, for messages. */
export function storeSyntax(): string {
  return DRIVERS.map((d) => d.syntax).join(" or ");
}
