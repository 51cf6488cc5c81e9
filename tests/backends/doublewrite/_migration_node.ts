/**
 * One idalloc node in its own process for the migration test (`migration.test.ts`), in any of
 * Cilium's identity allocation modes: connects (`ModeConfig` as JSON, argv[2]), prints
 * `{"ready":true}` once its cache is synced, then takes commands on stdin, one per line:
 * - `alloc <file>`: allocates the label sets of the JSON file (`[["k8s:a=1", …], …]`, as Cilium's
 *   node reads them), 4 at a time, holds them and prints `{ids, created, errors}`;
 * - `answers`: prints `{cached, store}` — its answer for every held key from memory (`get`) and
 *   from the store (`getNoCache`) — and how many held keys it reassigned;
 * - `end`: closes the node (without releasing: a node stopped for a restart leaves its
 *   references to lapse with its lease) and exits.
 *
 * deno run -A tests/backends/doublewrite/_migration_node.ts '<ModeConfig as JSON>'
 */
import { readFile } from "node:fs/promises";
import process from "node:process";
import { createInterface } from "node:readline";
import { Allocator } from "../../../mod.ts";
import { Labels } from "../../../src/identity/mod.ts";
import { type ModeConfig, openMode } from "./_world.ts";

/** The node's report of an `alloc`. */
export interface AllocReport {
  /** Key → ID. */
  readonly ids: Record<string, number>;
  /** Keys whose identity this node created. */
  readonly created: string[];
  readonly errors: string[];
}

/** The node's answers for its held keys. */
export interface AnswersReport {
  readonly cached: Record<string, number | null>;
  readonly store: Record<string, number | null>;
  readonly reassigned: number;
}

const say = (o: unknown) => console.log(JSON.stringify(o));

async function allocateAll(alloc: Allocator<string>, keys: readonly string[]) {
  const report: AllocReport = { ids: {}, created: [], errors: [] };
  let next = 0;
  await Promise.all(Array.from({ length: 4 }, async () => {
    while (next < keys.length) {
      const key = keys[next++];
      try {
        const r = await alloc.allocate(key);
        report.ids[key] = r.id;
        if (r.isNew) report.created.push(key);
      } catch (err) {
        report.errors.push(`${key}: ${err}`);
      }
    }
  }));
  return report;
}

async function main(config: ModeConfig): Promise<void> {
  const { backend, close } = await openMode(config);
  try {
    await using alloc = await Allocator.open(backend, {
      min: 256,
      max: 65535,
      leaseTtlMs: 3_000,
      maxAttempts: 64,
    });
    await alloc.waitForInitialSync();
    say({ ready: true });
    const held = new Set<string>();
    for await (const command of createInterface({ input: process.stdin })) {
      if (command === "end") break;
      if (command.startsWith("alloc ")) {
        const sets = JSON.parse(await readFile(command.slice(6), "utf8")) as string[][];
        const keys = sets.map((s) => Labels.parse(s).toKvstoreString());
        const report = await allocateAll(alloc, keys);
        for (const key of Object.keys(report.ids)) held.add(key);
        say(report);
      }
      if (command === "answers") {
        const cached: Record<string, number | null> = {};
        const store: Record<string, number | null> = {};
        for (const key of held) {
          cached[key] = (await alloc.get(key)) ?? null;
          store[key] = (await alloc.getNoCache(key)) ?? null;
        }
        say({ cached, store, reassigned: alloc.status().fence.reassigned } satisfies AnswersReport);
      }
    }
  } finally {
    await close();
  }
}

if (import.meta.main) {
  await main(JSON.parse(process.argv[2]) as ModeConfig);
  // stdin's reader would keep the process alive after `end`.
  process.exit(0);
}
