/** The race test's keys and how each node allocates them (in-process and in `_race_child.ts`). */
import type { Allocator } from "../../../src/allocator/allocator.ts";

/** `count` new keys: label sets (stored as their map) and plain keys (stored under idalloc:key). */
export function raceKeys(count: number): string[] {
  return Array.from(
    { length: count },
    (_, i) => i % 2 === 0 ? `k8s:app=race-${i};` : `race-${i}`,
  );
}

/** What one node got: key → ID, and the keys whose identity it created. */
export interface RaceResult {
  readonly ids: Record<string, number>;
  readonly created: string[];
}

/** Allocates `keys` in order, 16 at a time. */
export async function allocateAll(alloc: Allocator<string>, keys: string[]): Promise<RaceResult> {
  const ids: Record<string, number> = {};
  const created: string[] = [];
  let next = 0;
  await Promise.all(Array.from({ length: 16 }, async () => {
    while (next < keys.length) {
      const key = keys[next++];
      const r = await alloc.allocate(key);
      ids[key] = r.id;
      if (r.isNew) created.push(key);
    }
  }));
  return { ids, created };
}
